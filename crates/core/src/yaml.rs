//! A YAML tree that remembers where every node came from.
//!
//! Serde-based YAML loaders forget positions once a value is built, but
//! `logbus validate` must point at the line and column of each bad option,
//! unknown input or duplicate id. So the file is read into this tree (from
//! yaml-rust2's event stream), checked with positions, and only then turned
//! into JSON values for the plugins' typed option structs.

use std::collections::HashMap;
use std::fmt;

use serde_json::{Number, Value};
use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// A 1-based line and column in the pipeline file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, serde::Serialize)]
pub struct Pos {
    pub line: usize,
    pub col: usize,
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

impl From<Marker> for Pos {
    fn from(m: Marker) -> Self {
        Pos {
            line: m.line(),
            col: m.col() + 1,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum NodeKind {
    /// `plain` scalars are typed by the YAML 1.2 core schema (`3` is a
    /// number); quoted and block scalars are always strings.
    Scalar {
        text: String,
        plain: bool,
    },
    Seq(Vec<Node>),
    /// Entries in file order; duplicate keys are kept so they can be reported.
    Map(Vec<(Node, Node)>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub kind: NodeKind,
    pub pos: Pos,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct YamlError {
    pub message: String,
    pub pos: Pos,
}

/// Deepest nesting a pipeline file may have. Real pipelines stay under
/// ten levels; the limit keeps the recursive walks over the tree (checks,
/// conversion, drop) far from the stack's end, whatever the file.
pub const MAX_DEPTH: usize = 128;

/// What aliases may copy, in approximate bytes (a node counts
/// [`NODE_WEIGHT`], a scalar its text besides): a fixed allowance plus ten
/// times the file's own length. A "billion laughs" file of a few hundred
/// bytes is refused after about a megabyte instead of growing to gigabytes.
const ALIAS_ALLOWANCE: usize = 1 << 20;
const NODE_WEIGHT: usize = 64;

/// Parses one YAML document. An empty file gives `None`.
///
/// The parser is driven event by event (yaml-rust2's own loader recurses
/// once per nesting level), and the tree is checked as it grows: too deep
/// or too much copied through aliases is an error at the offending node.
pub fn parse(text: &str) -> Result<Option<Node>, YamlError> {
    let alias_limit = ALIAS_ALLOWANCE.saturating_add(text.len().saturating_mul(10));
    let mut builder = Builder {
        alias_budget: alias_limit,
        alias_limit,
        ..Builder::default()
    };
    let mut parser = Parser::new_from_str(text);
    loop {
        let (event, mark) = parser.next_token().map_err(|e| YamlError {
            message: e.info().to_string(),
            pos: (*e.marker()).into(),
        })?;
        match event {
            Event::StreamEnd | Event::DocumentEnd => break,
            event => builder.on_event(event, mark)?,
        }
    }
    Ok(builder.root)
}

/// An open sequence or mapping: the node, its anchor id (0 for none) and
/// its weight so far.
struct Open {
    node: Node,
    anchor: usize,
    weight: usize,
    /// For a mapping, the key waiting for its value.
    pending_key: Option<Node>,
}

#[derive(Default)]
struct Builder {
    stack: Vec<Open>,
    /// Anchored nodes with their weights.
    anchors: HashMap<usize, (Node, usize)>,
    root: Option<Node>,
    alias_limit: usize,
    alias_budget: usize,
}

impl Builder {
    fn push_value(&mut self, node: Node, anchor: usize, weight: usize) {
        if anchor > 0 {
            self.anchors.insert(anchor, (node.clone(), weight));
        }
        let Some(parent) = self.stack.last_mut() else {
            self.root = Some(node);
            return;
        };
        parent.weight = parent.weight.saturating_add(weight);
        match &mut parent.node.kind {
            NodeKind::Seq(items) => items.push(node),
            NodeKind::Map(entries) => match parent.pending_key.take() {
                None => parent.pending_key = Some(node),
                Some(key) => entries.push((key, node)),
            },
            NodeKind::Scalar { .. } => unreachable!("scalars are never open"),
        }
    }

    fn open(&mut self, kind: NodeKind, anchor: usize, pos: Pos) -> Result<(), YamlError> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(YamlError {
                message: format!("nesting deeper than {MAX_DEPTH} levels"),
                pos,
            });
        }
        self.stack.push(Open {
            node: Node { kind, pos },
            anchor,
            weight: NODE_WEIGHT,
            pending_key: None,
        });
        Ok(())
    }

    fn close(&mut self) {
        if let Some(open) = self.stack.pop() {
            self.push_value(open.node, open.anchor, open.weight);
        }
    }

    fn on_event(&mut self, ev: Event, mark: Marker) -> Result<(), YamlError> {
        let pos = Pos::from(mark);
        match ev {
            Event::Scalar(text, style, anchor, tag) => {
                let forced_string = tag.as_ref().is_some_and(|t| t.suffix == "str");
                let plain = style == TScalarStyle::Plain && !forced_string;
                let weight = NODE_WEIGHT + text.len();
                self.push_value(
                    Node {
                        kind: NodeKind::Scalar { text, plain },
                        pos,
                    },
                    anchor,
                    weight,
                );
            }
            Event::SequenceStart(anchor, _) => self.open(NodeKind::Seq(Vec::new()), anchor, pos)?,
            Event::MappingStart(anchor, _) => self.open(NodeKind::Map(Vec::new()), anchor, pos)?,
            Event::SequenceEnd | Event::MappingEnd => self.close(),
            Event::Alias(id) => {
                let Some((node, weight)) = self.anchors.get(&id) else {
                    return Err(YamlError {
                        message: "alias refers to an unknown anchor".into(),
                        pos,
                    });
                };
                let weight = *weight;
                if weight > self.alias_budget {
                    return Err(YamlError {
                        message: format!(
                            "aliases copy more than the {} KiB this file may expand to \
                             (1 MiB plus ten times its size)",
                            self.alias_limit / 1024
                        ),
                        pos,
                    });
                }
                self.alias_budget -= weight;
                let mut node = node.clone();
                node.pos = pos;
                self.push_value(node, 0, weight);
            }
            _ => {}
        }
        Ok(())
    }
}

impl Node {
    pub fn as_str(&self) -> Option<&str> {
        match &self.kind {
            NodeKind::Scalar { text, .. } => Some(text),
            _ => None,
        }
    }

    pub fn entries(&self) -> Option<&[(Node, Node)]> {
        match &self.kind {
            NodeKind::Map(e) => Some(e),
            _ => None,
        }
    }

    /// The first entry with this key.
    pub fn entry(&self, key: &str) -> Option<&(Node, Node)> {
        self.entries()?
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
    }

    pub fn get(&self, key: &str) -> Option<&Node> {
        self.entry(key).map(|(_, v)| v)
    }

    /// Position of the option at `path` below this node: the key's position
    /// for a map entry, the item's for a list index; the deepest node found
    /// when the path runs out (a missing option points at its parent).
    pub fn pos_of(&self, path: &[String]) -> Pos {
        let mut node = self;
        let mut pos = self.pos;
        for seg in path {
            match &node.kind {
                NodeKind::Map(_) => match node.entry(seg) {
                    Some((k, v)) => {
                        pos = k.pos;
                        node = v;
                    }
                    None => return pos,
                },
                NodeKind::Seq(items) => {
                    match seg.parse::<usize>().ok().and_then(|i| items.get(i)) {
                        Some(item) => {
                            pos = item.pos;
                            node = item;
                        }
                        None => return pos,
                    }
                }
                NodeKind::Scalar { .. } => return pos,
            }
        }
        pos
    }

    /// Expands `${VAR}` and `${VAR:-default}` in every scalar value (map
    /// keys are left alone), collecting an error per unset variable.
    pub fn expand_env(
        &mut self,
        lookup: &dyn Fn(&str) -> Option<String>,
        errors: &mut Vec<YamlError>,
    ) {
        match &mut self.kind {
            NodeKind::Scalar { text, plain } => {
                if text.contains('$') {
                    // `"${N}"` alone is typed by its value, so a number can
                    // come from the environment in a flow map, where `{` forces quotes.
                    let whole = text.starts_with("${") && text.find('}') == Some(text.len() - 1);
                    match expand_vars(text, lookup) {
                        Ok(expanded) => {
                            *text = expanded;
                            *plain |= whole;
                        }
                        Err(message) => errors.push(YamlError {
                            message,
                            pos: self.pos,
                        }),
                    }
                }
            }
            NodeKind::Seq(items) => items.iter_mut().for_each(|n| n.expand_env(lookup, errors)),
            NodeKind::Map(entries) => entries
                .iter_mut()
                .for_each(|(_, v)| v.expand_env(lookup, errors)),
        }
    }

    /// Converts to JSON, typing plain scalars by the YAML 1.2 core schema.
    /// Later duplicate keys win (duplicates are reported by the validator).
    pub fn to_json(&self) -> Value {
        match &self.kind {
            NodeKind::Scalar { text, plain: true } => resolve_plain(text),
            NodeKind::Scalar { text, plain: false } => Value::String(text.clone()),
            NodeKind::Seq(items) => Value::Array(items.iter().map(Node::to_json).collect()),
            NodeKind::Map(entries) => Value::Object(
                entries
                    .iter()
                    .map(|(k, v)| (key_text(k), v.to_json()))
                    .collect(),
            ),
        }
    }
}

fn key_text(key: &Node) -> String {
    match &key.kind {
        NodeKind::Scalar { text, .. } => text.clone(),
        _ => key.to_json().to_string(),
    }
}

/// `$$` is a literal `$`; `${NAME}` must be set; `${NAME:-default}` falls back
/// when NAME is unset or empty.
pub fn expand_vars(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('{') {
            let Some(end) = body.find('}') else {
                return Err(format!("unterminated `${{` in `{text}`"));
            };
            let expr = &body[..end];
            let (name, default) = match expr.split_once(":-") {
                Some((n, d)) => (n, Some(d)),
                None => (expr, None),
            };
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("`${{{expr}}}` is not a valid variable reference"));
            }
            match (
                lookup(name).filter(|v| !v.is_empty() || default.is_none()),
                default,
            ) {
                (Some(v), _) => out.push_str(&v),
                (None, Some(d)) => out.push_str(d),
                (None, None) => {
                    return Err(format!(
                        "environment variable `{name}` is not set (use `${{{name}:-default}}` for a fallback)"
                    ));
                }
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn resolve_plain(text: &str) -> Value {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        _ => {}
    }
    let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
    let negative = text.starts_with('-');
    let radix = if let Some(h) = unsigned.strip_prefix("0x") {
        Some((h, 16))
    } else {
        unsigned.strip_prefix("0o").map(|o| (o, 8))
    };
    if let Some(v) = radix.and_then(|(digits, radix)| i64::from_str_radix(digits, radix).ok()) {
        return Value::Number(Number::from(if negative { -v } else { v }));
    }
    if !unsigned.is_empty() && unsigned.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(v) = text.parse::<i64>() {
            return Value::Number(v.into());
        }
        if let Ok(v) = text.parse::<u64>() {
            return Value::Number(v.into());
        }
    }
    let looks_float = unsigned
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'-' | b'+'))
        && unsigned.bytes().any(|b| b.is_ascii_digit());
    if let Some(n) = looks_float
        .then(|| text.parse::<f64>().ok().and_then(Number::from_f64))
        .flatten()
    {
        return Value::Number(n);
    }
    Value::String(text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn positions_of_keys_and_items() {
        let doc = parse("a:\n  b: 1\n  c: [x, y]\n").unwrap().unwrap();
        assert_eq!(
            doc.pos_of(&["a".into(), "b".into()]),
            Pos { line: 2, col: 3 }
        );
        assert_eq!(
            doc.pos_of(&["a".into(), "c".into(), "1".into()]),
            Pos { line: 3, col: 10 }
        );
        // A missing key points at its parent key.
        assert_eq!(
            doc.pos_of(&["a".into(), "zz".into()]),
            Pos { line: 1, col: 1 }
        );
    }

    #[test]
    fn core_schema_typing() {
        let doc = parse("a: 1\nb: '1'\nc: true\nd: ~\ne: 1.5\nf: 0x10\ng: hello\nh: -3\n")
            .unwrap()
            .unwrap();
        assert_eq!(
            doc.to_json(),
            json!({"a": 1, "b": "1", "c": true, "d": null, "e": 1.5, "f": 16, "g": "hello", "h": -3})
        );
    }

    #[test]
    fn duplicate_keys_are_kept_for_reporting() {
        let doc = parse("a: 1\na: 2\n").unwrap().unwrap();
        assert_eq!(doc.entries().unwrap().len(), 2);
    }

    #[test]
    fn anchors_and_aliases() {
        let doc = parse("x: &v {k: 1}\ny: *v\n").unwrap().unwrap();
        assert_eq!(doc.to_json(), json!({"x": {"k": 1}, "y": {"k": 1}}));
    }

    #[test]
    fn an_alias_bomb_is_refused_at_the_alias_that_crosses_the_limit() {
        let mut text = String::from(
            "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
        );
        for (prev, name) in ["a", "b", "c", "d", "e", "f", "g", "h"]
            .iter()
            .zip(["b", "c", "d", "e", "f", "g", "h", "i"])
        {
            let aliases = vec![format!("*{prev}"); 9].join(",");
            text.push_str(&format!("{name}: &{name} [{aliases}]\n"));
        }
        assert!(text.len() < 500, "{}", text.len());
        let err = parse(&text).unwrap_err();
        assert!(err.message.contains("aliases copy more than"), "{err:?}");
        assert!(err.pos.line >= 4 && err.pos.line <= 9, "{err:?}");
        // Reuse that stays inside the allowance is fine.
        let small = "x: &v {k: [1, 2, 3]}\ny: [*v, *v, *v, *v]\n";
        assert!(parse(small).is_ok());
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        // 30,000 levels in 60 KB, as the attack used.
        let nested = format!("{}x\n", "- ".repeat(30_000));
        let err = parse(&nested).unwrap_err();
        assert!(err.message.contains("nesting deeper than 128"), "{err:?}");
        assert_eq!(err.pos.line, 1, "{err:?}");
        let flow = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(parse(&flow).is_err());
        // Exactly at the limit is accepted.
        let ok: String = (0..MAX_DEPTH)
            .map(|d| format!("{}a:\n", " ".repeat(d)))
            .collect();
        assert!(parse(&(ok + &" ".repeat(MAX_DEPTH) + "1\n")).is_ok());
    }

    #[test]
    fn syntax_error_has_position() {
        let err = parse("a: [1, 2\nb: 3\n").unwrap_err();
        assert!(err.pos.line >= 1, "{err:?}");
    }

    #[test]
    fn env_expansion() {
        let env = |k: &str| match k {
            "SET" => Some("v".to_string()),
            "EMPTY" => Some(String::new()),
            _ => None,
        };
        assert_eq!(expand_vars("a${SET}b", &env).unwrap(), "avb");
        assert_eq!(expand_vars("${UNSET:-d}", &env).unwrap(), "d");
        assert_eq!(expand_vars("${EMPTY:-d}", &env).unwrap(), "d");
        assert_eq!(expand_vars("${EMPTY}", &env).unwrap(), "");
        assert_eq!(expand_vars("$$HOME $x", &env).unwrap(), "$HOME $x");
        assert!(
            expand_vars("${UNSET}", &env)
                .unwrap_err()
                .contains("`UNSET` is not set")
        );
        assert!(expand_vars("${OPEN", &env).is_err());
        assert!(expand_vars("${a b}", &env).is_err());
    }

    #[test]
    fn expanded_plain_scalar_is_typed_after_expansion() {
        let mut doc = parse("cap: ${CAP:-64}\nq: '${CAP:-64}'\nr: 'n${CAP:-64}'\n")
            .unwrap()
            .unwrap();
        let mut errors = Vec::new();
        doc.expand_env(&|_| None, &mut errors);
        assert!(errors.is_empty());
        // A whole-value reference is typed by its value even when quoted; a partial one stays text.
        assert_eq!(doc.to_json(), json!({"cap": 64, "q": 64, "r": "n64"}));
    }

    #[test]
    fn plain_scalars_are_typed_at_every_edge() {
        let cases = [
            ("", json!(null)),
            ("Null", json!(null)),
            ("NULL", json!(null)),
            ("True", json!(true)),
            ("TRUE", json!(true)),
            ("False", json!(false)),
            ("FALSE", json!(false)),
            ("yes", json!("yes")),
            ("-0x10", json!(-16)),
            ("+0x10", json!(16)),
            ("0o17", json!(15)),
            ("-0o17", json!(-15)),
            ("0X10", json!("0X10")),
            ("0xzz", json!("0xzz")),
            ("+7", json!(7)),
            ("-9223372036854775808", json!(i64::MIN)),
            ("18446744073709551615", json!(u64::MAX)),
            ("18446744073709551616", json!(18446744073709551616.0)),
            ("1e3", json!(1000.0)),
            ("-1.5E-1", json!(-0.15)),
            ("1-2", json!("1-2")),
            ("e", json!("e")),
            ("+", json!("+")),
            (".", json!(".")),
            ("1.2.3", json!("1.2.3")),
            ("1.5x", json!("1.5x")),
            ("nan", json!("nan")),
        ];
        for (text, want) in cases {
            assert_eq!(resolve_plain(text), want, "{text:?}");
        }
    }

    #[test]
    fn quoted_block_and_tagged_scalars_stay_text() {
        let doc = parse("a: \"1\"\nb: !!str 2\nc: |\n  3\nd: 4\n")
            .unwrap()
            .unwrap();
        assert_eq!(
            doc.to_json(),
            json!({"a": "1", "b": "2", "c": "3\n", "d": 4})
        );
        // A key that is not a scalar becomes its JSON text.
        let doc = parse("? [a, 1]\n: x\n").unwrap().unwrap();
        assert_eq!(doc.to_json(), json!({"[\"a\",1]": "x"}));
    }

    #[test]
    fn nodes_are_found_by_key_and_path() {
        let doc = parse("a:\n  b: [x, {c: 1}]\n  b: 2\nd: text\n")
            .unwrap()
            .unwrap();
        assert_eq!(doc.get("d").and_then(Node::as_str), Some("text"));
        assert!(doc.get("zz").is_none());
        assert!(doc.get("a").unwrap().as_str().is_none());
        assert!(doc.get("d").unwrap().entries().is_none());
        assert!(doc.get("d").unwrap().get("x").is_none());
        // The first of duplicate keys; JSON takes the last.
        assert_eq!(
            doc.get("a").unwrap().get("b").unwrap().pos,
            Pos { line: 2, col: 6 }
        );
        assert_eq!(doc.to_json()["a"]["b"], json!(2));
        let path = |p: &[&str]| doc.pos_of(&p.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(path(&[]), doc.pos);
        assert_eq!(path(&["a", "b", "1", "c"]), Pos { line: 2, col: 11 });
        // Past the end of a list, or a non-number index: the list's key.
        assert_eq!(path(&["a", "b", "2"]), Pos { line: 2, col: 3 });
        assert_eq!(path(&["a", "b", "x"]), Pos { line: 2, col: 3 });
        // Below a scalar: the scalar's key.
        assert_eq!(path(&["d", "e", "f"]), Pos { line: 4, col: 1 });
        assert_eq!(Pos { line: 3, col: 9 }.to_string(), "3:9");
    }

    #[test]
    fn variables_expand_in_values_and_never_in_keys() {
        let mut doc =
            parse("${K}: ${V}\nlist: [a$$b, '${V}x', {n: '${N}'}]\nbad: ${NOPE}\nalso: ${NOPE2}\n")
                .unwrap()
                .unwrap();
        let mut errors = Vec::new();
        let env = |k: &str| match k {
            "V" => Some("v".to_string()),
            "N" => Some("5".to_string()),
            _ => None,
        };
        doc.expand_env(&env, &mut errors);
        let errors: Vec<(String, Pos)> = errors.into_iter().map(|e| (e.message, e.pos)).collect();
        assert_eq!(
            errors,
            [
                (
                    "environment variable `NOPE` is not set (use `${NOPE:-default}` for a fallback)".to_string(),
                    Pos { line: 3, col: 6 }
                ),
                (
                    "environment variable `NOPE2` is not set (use `${NOPE2:-default}` for a fallback)".to_string(),
                    Pos { line: 4, col: 7 }
                ),
            ]
        );
        assert_eq!(
            doc.to_json(),
            json!({"${K}": "v", "list": ["a$b", "vx", {"n": 5}], "bad": "${NOPE}", "also": "${NOPE2}"})
        );
        // Only a value that is one whole reference is typed by what it
        // expands to.
        for (text, want) in [
            ("'${N}'", json!(5)),
            ("'${N}}'", json!("5}")),
            ("'x${N}'", json!("x5")),
            ("'$N'", json!("$N")),
            ("'1${N}'", json!("15")),
            ("'${N}0'", json!("50")),
        ] {
            let mut doc = parse(&format!("k: {text}\n")).unwrap().unwrap();
            doc.expand_env(&env, &mut Vec::new());
            assert_eq!(doc.to_json()["k"], want, "{text}");
        }
        assert_eq!(
            expand_vars("${OPEN", &env),
            Err("unterminated `${` in `${OPEN`".to_string())
        );
        assert_eq!(
            expand_vars("${}", &env),
            Err("`${}` is not a valid variable reference".to_string())
        );
        assert_eq!(
            expand_vars("${a-b:-x}", &env),
            Err("`${a-b:-x}` is not a valid variable reference".to_string())
        );
        assert_eq!(expand_vars("${V:-d}${N}$", &env).unwrap(), "v5$");
        assert_eq!(expand_vars("a_1${V_:-}", &env).unwrap(), "a_1");
    }

    #[test]
    fn an_alias_to_nothing_and_the_exact_alias_budget() {
        let err = parse("a: *nope\n").unwrap_err();
        assert_eq!(err.pos.line, 1);
        assert!(!err.message.is_empty());
        // An anchored scalar weighs NODE_WEIGHT plus its text; the budget
        // is 1 MiB plus ten times the file: aliases may copy exactly that.
        let text_len = |n: usize| {
            format!(
                "a: &x {}\nb: [{}]\n",
                "y".repeat(1000),
                vec!["*x"; n].join(", ")
            )
            .len()
        };
        let weight = NODE_WEIGHT + 1000;
        let mut n = 1;
        while n * weight <= ALIAS_ALLOWANCE + text_len(n) * 10 {
            n += 1;
        }
        // `n` aliases weigh more than the budget of their file; `n - 1` fit.
        let doc = |n: usize| {
            parse(&format!(
                "a: &x {}\nb: [{}]\n",
                "y".repeat(1000),
                vec!["*x"; n].join(", ")
            ))
        };
        assert!(doc(n - 1).is_ok());
        let err = doc(n).unwrap_err();
        assert_eq!(
            err.message,
            format!(
                "aliases copy more than the {} KiB this file may expand to (1 MiB plus ten times its size)",
                (ALIAS_ALLOWANCE + text_len(n) * 10) / 1024
            )
        );
        assert_eq!(err.pos.line, 2);
        // 1123 copies of a 918-byte scalar spend the budget of their file
        // to the byte: allowed; one more is not.
        let doc = |n: usize| {
            format!(
                "a: &x {}\nb: [{}]\n",
                "y".repeat(918),
                vec!["*x"; n].join(", ")
            )
        };
        assert_eq!(
            1123 * (NODE_WEIGHT + 918),
            ALIAS_ALLOWANCE + doc(1123).len() * 10
        );
        assert!(parse(&doc(1123)).is_ok());
        assert!(parse(&doc(1124)).is_err());
    }
}
