use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use logbus_event::{Event, Fields, LazyFields, Meta, Payload};

fn fields(v: Value) -> Fields {
    serde_json::from_value(v).unwrap()
}

/// Whether `condition` holds for `event` as ordinary fields, checked to
/// give the same answer on the event as lazy fields (its compact JSON
/// text), which the evaluation must read without building them.
fn holds(condition: &str, event: Value) -> bool {
    let c = Condition::compile(condition)
        .unwrap_or_else(|e| panic!("{condition}: {e}\n{}", e.caret(condition)));
    let answer = c.matches(&fields(event.clone()));
    let text = serde_json::to_vec(&event).unwrap();
    if let Some(lazy) = LazyFields::parse(bytes::Bytes::from(text)) {
        let lazy = Event::new(Payload::Lazy(lazy), Meta::at("test", 0));
        assert_eq!(c.matches(&lazy), answer, "{condition} on lazy {event}");
        assert!(
            matches!(lazy.payload(), Payload::Lazy(l) if !l.is_built()),
            "{condition} built the fields"
        );
    }
    answer
}

fn error(condition: &str) -> (usize, String) {
    let e = Condition::compile(condition).unwrap_err();
    (e.offset, e.message)
}

#[test]
fn comparisons_follow_the_filter_typing_rules() {
    let e = json!({"level": "error", "status": 503, "ratio": 0.5, "ok": true, "n": null});
    assert!(holds(r#"level == "error""#, e.clone()));
    assert!(!holds(r#"level == "info""#, e.clone()));
    assert!(holds("status == 503.0", e.clone()));
    assert!(holds("n == null", e.clone()));
    assert!(!holds("missing == null", e.clone()));
    assert!(holds("missing != 1", e.clone()));
    assert!(!holds("status != 503", e.clone()));
    assert!(holds("status > 500", e.clone()));
    assert!(!holds("status > 503", e.clone()));
    assert!(holds("status >= 503", e.clone()));
    assert!(holds("status < 504", e.clone()));
    assert!(!holds("status < 503", e.clone()));
    assert!(holds("status <= 503", e.clone()));
    assert!(!holds("status <= 502", e.clone()));
    assert!(holds("ratio < 1", e.clone()));
    // Two strings by their bytes; a number and a string field never.
    assert!(holds(r#"level < "warn""#, e.clone()));
    assert!(!holds("level > 1", e.clone()));
    assert!(!holds("missing > 1", e.clone()));
    assert!(!holds("missing < 1", e.clone()));
    assert!(holds("ok", e.clone()));
    assert!(!holds("level", e.clone()));
    assert!(!holds("missing", e));
}

#[test]
fn logic_grouping_and_precedence() {
    let e = json!({"level": "warn", "service": "auth", "status": 502});
    assert!(holds(
        r#"level != "debug" && (service == "auth" || service == "billing") && status >= 500"#,
        e.clone()
    ));
    // && binds tighter than ||.
    assert!(holds(r#"true || false && false"#, e.clone()));
    assert!(!holds(r#"(true || false) && false"#, e.clone()));
    assert!(holds(r#"!(level == "debug")"#, e.clone()));
    assert!(!holds(r#"!!(level == "debug")"#, e.clone()));
    assert!(holds(r#"!false && !missing"#, e));
}

#[test]
fn in_regex_and_exists() {
    let e = json!({"level": "warn", "msg": "took 1500 ms", "a": {"b": null}, "tags": ["x", 2]});
    assert!(holds(r#"level in ["warn", "error"]"#, e.clone()));
    assert!(!holds(r#"level in ["info"]"#, e.clone()));
    assert!(!holds(r#"missing in ["warn"]"#, e.clone()));
    assert!(holds(r#"msg =~ "\d+ ms$""#, e.clone()));
    assert!(!holds(r#"msg =~ "^\d""#, e.clone()));
    assert!(holds(r#"msg !~ "^\d""#, e.clone()));
    assert!(!holds(r#"level =~ "^x" "#, e.clone()));
    // Not a string: `=~` does not hold, so `!~` does.
    assert!(!holds(r#"tags =~ "x""#, e.clone()));
    assert!(holds(r#"missing !~ "x""#, e.clone()));
    assert!(holds("exists(a.b)", e.clone()));
    assert!(!holds("exists(a.c)", e.clone()));
    assert!(!holds("exists(msg.x)", e));
}

#[test]
fn string_helpers() {
    let e = json!({"path": "/api/v1/users", "level": "WARN", "tags": ["blue", 7], "m": {"a": 1}});
    assert!(holds(r#"starts_with(path, "/api/")"#, e.clone()));
    assert!(!holds(r#"starts_with(path, "/v1")"#, e.clone()));
    assert!(holds(r#"ends_with(path, "users")"#, e.clone()));
    assert!(!holds(r#"ends_with(path, "user")"#, e.clone()));
    assert!(holds(r#"contains(path, "v1")"#, e.clone()));
    assert!(!holds(r#"contains(path, "v2")"#, e.clone()));
    assert!(holds(r#"contains(tags, "blue")"#, e.clone()));
    assert!(holds("contains(tags, 7.0)", e.clone()));
    assert!(!holds(r#"contains(tags, "red")"#, e.clone()));
    assert!(!holds(r#"contains(missing, "x")"#, e.clone()));
    assert!(holds(r#"lower(level) == "warn""#, e.clone()));
    assert!(holds(r#"upper(lower(level)) == "WARN""#, e.clone()));
    assert!(!holds(r#"lower(m) == "warn""#, e.clone()));
    assert!(holds("len(path) == 13", e.clone()));
    assert!(holds("len(tags) == 2", e.clone()));
    assert!(holds("len(m) == 1", e.clone()));
    assert!(!holds("len(missing) == 0", e.clone()));
    assert!(holds(r#"len("héllo") == 5"#, e));
}

#[test]
fn paths_dotted_and_quoted() {
    let e = json!({"resource": {"service.name": "api"}, "http": {"status": 500},
                   "list": {"0": "zero"}, "user-agent": "curl", "@t": 1, "in": 2});
    assert!(holds("http.status == 500", e.clone()));
    assert!(holds(r#"resource.`service.name` == "api""#, e.clone()));
    assert!(holds(r#"resource."service.name" == "api""#, e.clone()));
    assert!(holds(r#"list.0 == "zero""#, e.clone()));
    assert!(holds(
        r#"`user-agent` == "curl" && user-agent == "curl""#,
        e.clone()
    ));
    assert!(holds("@t == 1", e.clone()));
    assert!(holds("`in` == 2", e));
}

#[test]
fn errors_name_the_place() {
    assert_eq!(
        error("level == "),
        (
            9,
            "expected a field, a value, a function or `(`, found the end of the condition".into()
        )
    );
    assert_eq!(
        error("a = 1"),
        (2, "`=` alone is not an operator; compare with `==`".into())
    );
    assert_eq!(
        error("a & b"),
        (2, "`&` alone is not an operator; write `&&`".into())
    );
    assert_eq!(error(r#"a == "x"#).0, 5);
    assert_eq!(error("  ").1, "the condition is empty");
    assert_eq!(error(r#"level == "x" && "y""#).0, 16);
    assert!(error(r#"level == "x" && "y""#).1.contains("not a string"));
    assert_eq!(error(r#""x""#).0, 0);
    assert_eq!(error("lower(3) == 1").0, 6);
    assert_eq!(
        error("lowr(a)").1,
        "`lowr` is not a function; did you mean `lower`? (functions: exists, starts_with, ends_with, contains, lower, upper, len)"
    );
    assert_eq!(
        error("starts_with(a)").1,
        "`starts_with` takes 2 arguments, got 1"
    );
    assert_eq!(
        error("exists(\"a\")").1,
        "`exists` takes a field (`exists(user.id)`)"
    );
    assert_eq!(error(r#"msg =~ "(""#).0, 7);
    assert!(
        error(r#"msg =~ "(""#)
            .1
            .starts_with("invalid regular expression")
    );
    assert_eq!(
        error("msg =~ level").1,
        "expected a regular expression in quotes, found `level`"
    );
    assert_eq!(
        error("level in []").1,
        "the list is empty, so `in` would never hold"
    );
    assert_eq!(error("level in [a]").0, 10);
    assert_eq!(error("status > true").0, 9);
    assert_eq!(error(r#"1 < "a""#).0, 2);
    assert_eq!(
        error("a b").1,
        "expected `&&`, `||` or the end of the condition, found `b`"
    );
    assert_eq!(
        error("(a").1,
        "expected `)`, found the end of the condition"
    );
    assert_eq!(
        error("a."),
        (
            1,
            "expected a field name after `.`, found the end of the condition".into()
        )
    );
    assert_eq!(
        error("a == -").1,
        "`-` must start a number (there is no arithmetic)"
    );
    assert_eq!(error("a == 1e").1, "`1e` is not a number");
    assert_eq!(
        error("a == #").1,
        "`#` is not part of the condition language"
    );
    assert_eq!(error("`a").1, "this quoted key is not closed");
    assert_eq!(error("[1] == a").0, 0);
    let deep = format!("{}a{}", "(".repeat(100), ")".repeat(100));
    assert!(error(&deep).1.starts_with("nested more than 64 deep"));
    let nots = format!("{}a", "!".repeat(100));
    assert!(error(&nots).1.starts_with("nested more than 64 deep"));
}

#[test]
fn a_caret_points_at_the_error() {
    let text = "level == \"x\" &&\n  status >";
    let e = Condition::compile(text).unwrap_err();
    assert_eq!(e.caret(text), "  status >\n          ^");
    assert_eq!(e.line_column(text), (2, 11));
    let e = Condition::compile("a ==").unwrap_err();
    assert_eq!(e.caret("a =="), "a ==\n    ^");
}

#[test]
fn an_unexpected_token_is_named_as_written() {
    for op in [
        ")", "]", ",", ".", "==", "!=", "<", "<=", ">", ">=", "&&", "||", "=~", "!~", "!",
    ] {
        let text = format!("a == {op}");
        assert_eq!(
            error(&text),
            (
                5,
                format!("expected a field, a value, a function or `(`, found `{op}`")
            ),
            "{text}"
        );
    }
    for op in ["(", "["] {
        assert_eq!(
            error(&format!("1 {op}")).1,
            format!("expected `&&`, `||` or the end of the condition, found `{op}`")
        );
    }
    assert_eq!(error("exists(a b)").1, "expected `)`, found `b`");
    assert_eq!(error("a in x").1, "expected `[`, found `x`");
    assert_eq!(
        error("a in [1 2]").1,
        "expected `,` or `]`, found the number 2"
    );
    assert_eq!(
        error("a == 'x' 'y'").1,
        r#"expected `&&`, `||` or the end of the condition, found the string "y""#
    );
    assert_eq!(
        error("a `b`").1,
        "expected `&&`, `||` or the end of the condition, found `` `b` ``"
    );
}

#[test]
fn nesting_is_allowed_up_to_exactly_the_limit() {
    let parens = |n: usize| format!("{}a{}", "(".repeat(n), ")".repeat(n));
    assert!(Condition::compile(&parens(64)).is_ok());
    assert_eq!(error(&parens(65)), (65, "nested more than 64 deep".into()));
    let nots = |n: usize| format!("{}a", "!".repeat(n));
    assert!(Condition::compile(&nots(64)).is_ok());
    assert_eq!(error(&nots(65)).1, "nested more than 64 deep");
    // Depth is nesting, not length: a hundred siblings are fine.
    for sibling in ["!a", "(a)", "lower(a) == 'x'"] {
        let long = vec![sibling; 100].join(" && ");
        assert!(Condition::compile(&long).is_ok(), "{sibling}");
    }
    let calls = |n: usize| format!("{}a{}", "lower(".repeat(n), ")".repeat(n));
    assert!(Condition::compile(&calls(64)).is_ok());
    assert_eq!(error(&calls(65)).1, "nested more than 64 deep");
}

#[test]
fn numbers_end_where_a_number_ends() {
    // `-` starts the next number; it does not continue this one.
    assert_eq!(
        error("a == 1-2").1,
        "expected `&&`, `||` or the end of the condition, found the number -2"
    );
    assert!(holds("a == 1e-2", json!({"a": 0.01})));
    assert!(holds("a == 2E+1", json!({"a": 20})));
    // A dot continues a number only before a digit: `a.0.b` is a path.
    assert!(holds("a.0.b == 1.5", json!({"a": {"0": {"b": 1.5}}})));
    assert!(holds("list.10 == 2", json!({"list": {"10": 2}})));
}

#[test]
fn null_is_a_value_not_a_condition_nor_an_order() {
    assert_eq!(
        error("a > null"),
        (4, "`>` compares numbers or strings, not null".into())
    );
    assert_eq!(
        error("null && a").1,
        "the left side of `&&` must be a condition (a comparison, `exists(..)`, a field that is true), not null"
    );
    assert_eq!(
        error("a || 1").1,
        "the right side of `||` must be a condition (a comparison, `exists(..)`, a field that is true), not a number"
    );
    assert_eq!(
        error("!'x'").1,
        "what `!` negates must be a condition (a comparison, `exists(..)`, a field that is true), not a string"
    );
    assert_eq!(
        error("true =~ 'x'").1,
        "`=~` matches strings, not a boolean"
    );
    assert_eq!(
        error("len(null) == 1").1,
        "`len` takes strings or fields, not null"
    );
    assert_eq!(
        error("contains(a, true)").1,
        "`contains` takes strings or fields, not a boolean"
    );
}

#[test]
fn keywords_lists_and_path_segments_in_the_wrong_place() {
    assert!(holds("a == false", json!({"a": false})));
    assert!(!holds("a == false", json!({"a": true})));
    assert_eq!(
        Condition::compile("a == false").unwrap().to_string(),
        "a == false"
    );
    assert_eq!(
        error("in == 1"),
        (0, "expected a field or a value, found `in`".into())
    );
    assert_eq!(
        error("[1] == a"),
        (
            0,
            r#"a list belongs after `in` (`level in ["warn", "error"]`)"#.into()
        )
    );
    assert_eq!(
        error("a.-1 == 1"),
        (
            2,
            "expected a field name after `.`, found the number -1".into()
        )
    );
    assert_eq!(
        error(r#"a."" == 1"#),
        (
            2,
            r#"expected a field name after `.`, found the string """#.into()
        )
    );
}

#[test]
fn an_unknown_function_is_named_with_the_closest_one() {
    assert_eq!(
        error("foo(a)").1,
        "`foo` is not a function (functions: exists, starts_with, ends_with, contains, lower, upper, len)"
    );
}

#[test]
fn an_error_prints_its_message_and_its_line() {
    let text = "a == 1 &&\n  b ==\n  && c";
    let e = Condition::compile(text).unwrap_err();
    assert_eq!(e.to_string(), e.message);
    assert_eq!(e.line_column(text), (3, 3));
    assert_eq!(e.caret(text), "  && c\n  ^");
    // A line in the middle: the caret's line stops at its end.
    let text = "a ==\n  == b\nc";
    let e = Condition::compile(text).unwrap_err();
    assert_eq!(e.caret(text), "  == b\n  ^");
    assert_eq!(e.line_column(text), (2, 3));
}

#[test]
fn printing_is_canonical() {
    let printed = |t: &str| Condition::compile(t).unwrap().to_string();
    assert_eq!(
        printed(r#"(a=="x"||b)&&!(c>1)"#),
        r#"(a == "x" || b) && !(c > 1)"#
    );
    assert_eq!(printed("a || (b || c)"), "a || (b || c)");
    assert_eq!(printed("(a || b) || c"), "a || b || c");
    assert_eq!(printed("a && (b && c)"), "a && (b && c)");
    assert_eq!(
        printed(r#"resource."service.name" in ['a', 1]"#),
        r#"resource.`service.name` in ["a", 1]"#
    );
    assert_eq!(printed(r#"m =~ "\d\"""#), r#"m =~ "\\d\"""#);
    assert_eq!(printed("list.0 == `in`"), "list.`0` == `in`");
    assert_eq!(printed("!!a && !exists(b)"), "!!a && !exists(b)");
}

// --- property: the printed form compiles to the same condition ---------

fn arb_path() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "level", "status", "a.b", "`x.y`", "tags", "msg", "n", "missing", "ok",
    ])
    .prop_map(str::to_string)
}

fn arb_literal() -> impl Strategy<Value = String> {
    prop_oneof![
        (-3i64..600).prop_map(|n| n.to_string()),
        prop::sample::select(vec![
            "\"error\"",
            "\"warn\"",
            "'a\\\\b'",
            "\"\"",
            "true",
            "false",
            "null",
            "0.5",
            "1e2",
        ])
        .prop_map(str::to_string),
    ]
}

fn arb_operand() -> impl Strategy<Value = String> {
    prop_oneof![
        arb_path(),
        arb_literal(),
        arb_path().prop_map(|p| format!("lower({p})")),
        arb_path().prop_map(|p| format!("len({p})")),
    ]
}

fn arb_atom() -> impl Strategy<Value = String> {
    prop_oneof![
        (
            arb_operand(),
            prop::sample::select(vec!["==", "!="]),
            arb_operand()
        )
            .prop_map(|(a, op, b)| format!("{a} {op} {b}")),
        (
            arb_path(),
            prop::sample::select(vec!["<", "<=", ">", ">="]),
            -3i64..600
        )
            .prop_map(|(a, op, b)| format!("{a}{op}{b}")),
        (arb_path(), prop::collection::vec(arb_literal(), 1..4))
            .prop_map(|(a, l)| format!("{a} in [{}]", l.join(","))),
        (
            arb_path(),
            prop::sample::select(vec!["=~", "!~"]),
            prop::sample::select(vec!["\"^e\"", "\"\\\\d+\"", "\"r|w\""])
        )
            .prop_map(|(a, op, r)| format!("{a} {op} {r}")),
        arb_path().prop_map(|p| format!("exists({p})")),
        (arb_path(), prop::sample::select(vec!["\"e\"", "\"rr\""]))
            .prop_map(|(p, s)| format!("contains({p}, {s})")),
        arb_path(),
        Just("true".to_string()),
    ]
}

fn arb_condition() -> impl Strategy<Value = String> {
    arb_atom().prop_recursive(4, 24, 2, |inner| {
        prop_oneof![
            (
                inner.clone(),
                prop::sample::select(vec!["&&", "||"]),
                inner.clone()
            )
                .prop_map(|(a, op, b)| format!("{a} {op} {b}")),
            inner.clone().prop_map(|a| format!("({a})")),
            inner.prop_map(|a| format!("!({a})")),
        ]
    })
}

fn arb_event() -> impl Strategy<Value = Value> {
    (
        prop::option::of(prop::sample::select(vec![
            "error", "warn", "Error", "debug",
        ])),
        prop::option::of(-5i64..700),
        prop::option::of(any::<bool>()),
        prop::option::of(prop::sample::select(vec!["e1", "rr", "x"])),
    )
        .prop_map(|(level, status, ok, msg)| {
            let mut e = json!({"a": {"b": status}, "x.y": level, "tags": ["e", "rr", 1]});
            if let Some(l) = level {
                e["level"] = json!(l);
            }
            if let Some(s) = status {
                e["status"] = json!(s);
            }
            if let Some(o) = ok {
                e["ok"] = json!(o);
            }
            if let Some(m) = msg {
                e["msg"] = json!(m);
                e["n"] = json!(m.len());
            }
            e
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// An expression and its pretty-printed form evaluate the same on
    /// every event, and printing again changes nothing.
    #[test]
    fn the_printed_form_means_the_same(text in arb_condition(), events in prop::collection::vec(arb_event(), 8)) {
        let Ok(original) = Condition::compile(&text) else {
            // Generated type errors (`true > 1` cannot appear, but
            // `"" && ..` can): those are covered above.
            return Ok(());
        };
        let printed = original.to_string();
        let again = Condition::compile(&printed)
            .unwrap_or_else(|e| panic!("{text} printed as {printed}: {e}\n{}", e.caret(&printed)));
        prop_assert_eq!(&again.to_string(), &printed);
        for e in &events {
            let f = fields(e.clone());
            prop_assert_eq!(original.matches(&f), again.matches(&f), "{} vs {} on {}", text, printed, e);
        }
    }
}

#[test]
fn a_lazy_event_is_read_entry_by_entry_without_building_its_fields() {
    let line = r#"{"level":"warn","http":{"status":503},"tags":["a","b"],"n":1.5}"#;
    let lazy = LazyFields::parse(bytes::Bytes::from_static(line.as_bytes()))
        .expect("the line is kept lazy");
    let event = Event::new(Payload::Lazy(lazy), Meta::at("test", 0));
    for (condition, expected) in [
        (r#"level == "warn" && http.status >= 500"#, true),
        (r#"contains(tags, "b") && n < 2"#, true),
        (r#"exists(http.status) && !exists(http.missing)"#, true),
        (r#"upper(level) == "WARN" && len(tags) == 2"#, true),
        (r#"level in ["error", "info"] || http.status == 200"#, false),
    ] {
        assert_eq!(
            Condition::compile(condition).unwrap().matches(&event),
            expected,
            "{condition}"
        );
    }
    assert!(matches!(event.payload(), Payload::Lazy(l) if !l.is_built()));
    // A raw event has no fields: every path is missing.
    let raw = Event::raw(line, Meta::at("test", 0));
    assert!(!Condition::compile("exists(level)").unwrap().matches(&raw));
    assert!(Condition::compile("!exists(level)").unwrap().matches(&raw));
}

/// `field_uses`: every path in text order with its offset, its role and
/// the literal kind it is compared with.
#[test]
fn field_uses_name_each_path_its_offset_role_and_literal() {
    let uses = |text: &str| {
        Condition::compile(text)
            .unwrap()
            .field_uses()
            .into_iter()
            .map(|u| (u.path, u.offset, u.role, u.compared_with))
            .collect::<Vec<_>>()
    };
    use LiteralKind as L;
    use UseRole as R;
    assert_eq!(
        uses(r#"level == error && 500 <= status || !exists(a.b)"#),
        [
            ("level".into(), 0, R::Value, None),
            ("error".into(), 9, R::RightOperand, None),
            ("status".into(), 25, R::Value, Some(L::Number)),
            ("a.b".into(), 43, R::Probe, None),
        ]
    );
    assert_eq!(
        uses(r#"x == "s" && y != true && z == null && w in [1, 2] && v in [1, "a"]"#),
        [
            ("x".into(), 0, R::Value, Some(L::String)),
            ("y".into(), 12, R::Value, Some(L::Bool)),
            ("z".into(), 25, R::Value, Some(L::Null)),
            ("w".into(), 38, R::Value, Some(L::Number)),
            ("v".into(), 53, R::Value, None),
        ]
    );
    assert_eq!(
        uses(
            r#"m =~ "^a" && starts_with(p, "x") && len(q) > 1 && contains(r, "y") && lower(s) == "t""#
        ),
        [
            ("m".into(), 0, R::Value, Some(L::String)),
            ("p".into(), 25, R::Value, Some(L::String)),
            ("q".into(), 40, R::Value, None),
            ("r".into(), 59, R::Value, None),
            ("s".into(), 76, R::Value, Some(L::String)),
        ]
    );
    // `a == b`: only the right one is an operand; a literal on the left
    // types the field on the right.
    assert_eq!(
        uses(r#"(a == b) || "x" == c || d"#),
        [
            ("a".into(), 1, R::Value, None),
            ("b".into(), 6, R::RightOperand, None),
            ("c".into(), 19, R::Value, Some(L::String)),
            ("d".into(), 24, R::Value, None),
        ]
    );
    // A quoted segment is named by its dotted path, as fields are.
    assert_eq!(uses("`odd key`.x == 1")[0].0, "odd key.x");
    // A chain as long as a hostile one walks without recursion.
    let long = vec!["a == 1"; 20_000].join(" && ");
    assert_eq!(
        Condition::compile(&long).unwrap().field_uses().len(),
        20_000
    );
}

/// An 80,000-term `&&` or `||` chain (issue 54: it validated, then
/// overflowed the stack on the first event) compiles, evaluates, prints,
/// clones and drops on a thread with a 256 KiB stack, in `run` as in
/// `logbus test`: a chain is one node, so nothing recurses along it.
#[test]
fn a_hostile_chain_needs_no_stack_of_its_length() {
    let fields = json!({"a": 1, "b": 2}).as_object().unwrap().clone();
    for (op, expected) in [(" && ", true), (" || ", true)] {
        let text = vec!["a == 1"; 80_000].join(op);
        let mixed = format!("{text}{op}!(b == 3){op}(a == 1 || b == 2)");
        let fields = fields.clone();
        std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || {
                for text in [text, mixed] {
                    let condition = Condition::compile(&text).unwrap();
                    assert_eq!(condition.matches(&fields), expected, "{op}");
                    let printed = condition.to_string();
                    assert_eq!(printed.len(), text.len(), "{op}");
                    let copy = condition.clone();
                    drop(condition);
                    assert_eq!(
                        copy.field_uses().len(),
                        text.matches('a').count() + text.matches('b').count()
                    );
                }
            })
            .unwrap()
            .join()
            .expect("the chain needed more than 256 KiB of stack");
    }
    // An `&&` whose last term fails, and an `||` whose last term holds:
    // every term is looked at, in order.
    let last_fails = format!("{} && a == 2", vec!["a == 1"; 80_000].join(" && "));
    assert!(!Condition::compile(&last_fails).unwrap().matches(&fields));
    let last_holds = format!("{} || b == 2", vec!["a == 2"; 80_000].join(" || "));
    assert!(Condition::compile(&last_holds).unwrap().matches(&fields));
}
