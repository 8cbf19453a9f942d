use super::*;
use logbus_plugin_api::FieldRead;

struct S {
    id: &'static str,
    kind: StageKind,
    inputs: Vec<(String, Pos)>,
    outputs: Vec<String>,
    flow: Flow,
    pos: Vec<Pos>,
}

fn stage(id: &'static str, kind: StageKind, inputs: &[&str], flow: Flow) -> S {
    let pos = vec![Pos { line: 1, col: 1 }; flow.steps.len()];
    S {
        id,
        kind,
        inputs: inputs
            .iter()
            .map(|i| (i.to_string(), Pos { line: 2, col: 3 }))
            .collect(),
        outputs: Vec::new(),
        flow,
        pos,
    }
}

fn run(stages: &[S]) -> FlowReport {
    let views: Vec<FlowStage<'_>> = stages
        .iter()
        .map(|s| FlowStage {
            id: s.id,
            kind: s.kind,
            plugin: "p",
            pos: Pos { line: 9, col: 9 },
            inputs: &s.inputs,
            named_outputs: &s.outputs,
            flow: &s.flow,
            step_pos: &s.pos,
        })
        .collect();
    analyse(&views, true)
}

fn codes(r: &FlowReport) -> Vec<(&'static str, String)> {
    r.diagnostics
        .iter()
        .map(|d| (d.code, d.stage.clone().unwrap_or_default()))
        .collect()
}

fn read(field: &str, role: ReadRole) -> FieldRead {
    FieldRead::new(field, &["condition"], role)
}

#[test]
fn a_stage_that_needs_fields_fed_only_raw_events_is_an_error_at_its_input() {
    let r = run(&[
        stage("src", StageKind::Source, &[], Flow::raw()),
        stage(
            "keep",
            StageKind::Transform,
            &["src"],
            Flow::pass()
                .needs(Needs::Fields)
                .read(read("level", ReadRole::Optional)),
        ),
    ]);
    assert_eq!(codes(&r), [("needs-fields", "keep".to_string())]);
    assert_eq!(r.diagnostics[0].line, Some(2));
    assert!(
        r.diagnostics[0].message.contains("`src`"),
        "{}",
        r.diagnostics[0].message
    );
}

#[test]
fn raw_and_parsed_together_are_not_an_error() {
    let r = run(&[
        stage("a", StageKind::Source, &[], Flow::raw()),
        stage("b", StageKind::Source, &[], Flow::open_fields(&[])),
        stage(
            "f",
            StageKind::Transform,
            &["a", "b"],
            Flow::pass().needs(Needs::Fields),
        ),
    ]);
    assert!(r.diagnostics.is_empty());
}

#[test]
fn a_parser_fed_parsed_events_is_an_error() {
    let r = run(&[
        stage("a", StageKind::Source, &[], Flow::open_fields(&[])),
        stage(
            "p",
            StageKind::Parser,
            &["a"],
            Flow::raw().needs(Needs::Raw),
        ),
    ]);
    assert_eq!(codes(&r), [("needs-raw", "p".to_string())]);
}

#[test]
fn reads_under_closed_fields_are_checked_and_under_open_ones_kept_for_strict_mode() {
    let closed = Flow::fields(&[("level", FieldType::String), ("msg", FieldType::String)]);
    let r = run(&[
        stage("a", StageKind::Source, &[], closed),
        stage(
            "s",
            StageKind::Sink,
            &["a"],
            Flow::pass()
                .read(read("levl", ReadRole::Required))
                .read(read("msg", ReadRole::Required))
                .read(read("other", ReadRole::Optional))
                .read(read("gone", ReadRole::Probe)),
        ),
    ]);
    assert_eq!(
        codes(&r),
        [
            ("field-not-produced", "s".to_string()),
            ("field-not-produced", "s".to_string())
        ]
    );
    assert!(r.diagnostics[0].is_error());
    assert!(r.diagnostics[0].message.contains("did you mean `level`"));
    assert!(!r.diagnostics[1].is_error());

    let r = run(&[
        stage("a", StageKind::Source, &[], Flow::open_fields(&[])),
        stage(
            "s",
            StageKind::Sink,
            &["a"],
            Flow::pass().read(read("x", ReadRole::Required)),
        ),
    ]);
    assert!(r.diagnostics.is_empty());
    assert_eq!(r.undeclared.len(), 1);
    assert!(
        r.undeclared[0]
            .message
            .contains("`a` leaves its fields open")
    );
}

#[test]
fn a_right_operand_produced_nowhere_is_a_warning_even_under_open_fields() {
    let r = run(&[
        stage(
            "a",
            StageKind::Source,
            &[],
            Flow::open_fields(&[("level", FieldType::String)]),
        ),
        stage(
            "f",
            StageKind::Transform,
            &["a"],
            Flow::pass()
                .read(read("level", ReadRole::Optional))
                .read(read("error", ReadRole::RightOperand)),
        ),
    ]);
    assert_eq!(codes(&r), [("field-compared-to-unknown", "f".to_string())]);
    assert!(r.diagnostics[0].message.contains("\"error\""));
}

#[test]
fn sets_renames_deletes_and_types_follow_the_steps_in_order() {
    let r = run(&[
        stage(
            "a",
            StageKind::Source,
            &[],
            Flow::fields(&[("status", FieldType::String)]),
        ),
        stage(
            "t",
            StageKind::Transform,
            &["a"],
            Flow::pass()
                .needs(Needs::Fields)
                .then(Step::Rename {
                    from: "status".into(),
                    to: "http.status".into(),
                    option: vec![],
                })
                .set("host", FieldType::String, &[])
                .delete("host", &[]),
        ),
        stage(
            "s",
            StageKind::Sink,
            &["t"],
            Flow::pass()
                .read(read("http.status", ReadRole::Optional).expecting(FieldType::Number))
                .read(read("status", ReadRole::Optional))
                .read(read("host", ReadRole::Optional))
                .read(read("http", ReadRole::Required)),
        ),
    ]);
    // `host` is set and deleted before anything reads it.
    assert_eq!(
        codes(&r),
        [
            ("field-set-unused", "t".to_string()),
            ("type-mismatch", "s".to_string()),
            ("field-not-produced", "s".to_string()),
            ("field-not-produced", "s".to_string())
        ]
    );
}

#[test]
fn a_set_field_deleted_unread_is_reported_only_on_a_path_without_fan_out() {
    let setter = || {
        Flow::pass()
            .needs(Needs::Fields)
            .set("x", FieldType::String, &[])
    };
    let deleter = || Flow::pass().needs(Needs::Fields).delete("x", &[]);
    let src = || {
        stage(
            "a",
            StageKind::Source,
            &[],
            Flow::fields(&[("y", FieldType::Number)]),
        )
    };
    // a → set → delete: reported at the delete, naming the setter.
    let r = run(&[
        src(),
        stage("set", StageKind::Transform, &["a"], setter()),
        stage("del", StageKind::Transform, &["set"], deleter()),
    ]);
    assert_eq!(codes(&r), [("field-set-unused", "del".to_string())]);
    assert!(
        r.diagnostics[0].message.contains("set by `set`"),
        "{}",
        r.diagnostics[0].message
    );
    // Read in between: nothing.
    let r = run(&[
        src(),
        stage("set", StageKind::Transform, &["a"], setter()),
        stage(
            "f",
            StageKind::Transform,
            &["set"],
            Flow::pass().read(read("x", ReadRole::Optional)),
        ),
        stage("del", StageKind::Transform, &["f"], deleter()),
    ]);
    assert!(r.diagnostics.is_empty(), "{:?}", codes(&r));
    // Fan-out after the set: one branch may read it, another drop it.
    let r = run(&[
        src(),
        stage("set", StageKind::Transform, &["a"], setter()),
        stage("del", StageKind::Transform, &["set"], deleter()),
        stage("other", StageKind::Sink, &["set"], Flow::pass()),
    ]);
    assert!(r.diagnostics.is_empty(), "{:?}", codes(&r));
    // Parsed out of the input (a parser's fields) and dropped: on purpose.
    let r = run(&[
        stage("a", StageKind::Source, &[], Flow::raw()),
        stage(
            "p",
            StageKind::Parser,
            &["a"],
            Flow::fields(&[("x", FieldType::String)]).needs(Needs::Raw),
        ),
        stage("del", StageKind::Transform, &["p"], deleter()),
    ]);
    assert!(r.diagnostics.is_empty(), "{:?}", codes(&r));
    // A script between may have read it.
    let r = run(&[
        src(),
        stage("set", StageKind::Transform, &["a"], setter()),
        stage(
            "js",
            StageKind::Transform,
            &["set"],
            Flow::unknown(StageKind::Transform),
        ),
        stage("del", StageKind::Transform, &["js"], deleter()),
    ]);
    assert!(r.diagnostics.is_empty(), "{:?}", codes(&r));
}

#[test]
fn a_raw_event_handed_to_a_script_becomes_a_message() {
    let r = run(&[
        stage("a", StageKind::Source, &[], Flow::raw()),
        stage(
            "js",
            StageKind::Transform,
            &["a"],
            Flow::pass()
                .then(Step::RawAsMessage)
                .set("took", FieldType::Number, &[]),
        ),
        stage(
            "f",
            StageKind::Transform,
            &["js"],
            Flow::pass()
                .needs(Needs::Fields)
                .read(read("message", ReadRole::Required).expecting(FieldType::String))
                .read(read("took", ReadRole::Required).expecting(FieldType::Number))
                .read(read("other", ReadRole::Required)),
        ),
    ]);
    assert_eq!(codes(&r), [("field-not-produced", "f".to_string())]);
}

#[test]
fn errors_outputs_carry_what_the_stage_received_with_the_error() {
    let mut parse = stage(
        "p",
        StageKind::Parser,
        &["a"],
        Flow::open_fields(&[]).needs(Needs::Raw),
    );
    parse.outputs = vec![];
    let r = run(&[
        stage("a", StageKind::Source, &[], Flow::raw()),
        parse,
        stage(
            "bad",
            StageKind::Sink,
            &["p.errors"],
            Flow::pass()
                .read(read("message", ReadRole::Required))
                .read(read("_error.stage", ReadRole::Required))
                .read(read("nope", ReadRole::Required)),
        ),
    ]);
    assert_eq!(codes(&r), [("field-not-produced", "bad".to_string())]);
}

#[test]
fn named_outputs_and_unknown_plugins_pass_shapes_on() {
    let mut route = stage(
        "r",
        StageKind::Transform,
        &["a"],
        Flow::pass().needs(Needs::Fields),
    );
    route.outputs = vec!["x".into(), "_other".into()];
    let r = run(&[
        stage(
            "a",
            StageKind::Source,
            &[],
            Flow::fields(&[("k", FieldType::Number)]),
        ),
        route,
        stage(
            "u",
            StageKind::Transform,
            &["r.x"],
            Flow::unknown(StageKind::Transform),
        ),
        stage(
            "s",
            StageKind::Sink,
            &["u", "r._other"],
            Flow::pass()
                .read(read("k", ReadRole::Required).expecting(FieldType::String))
                .read(read("anything", ReadRole::Required)),
        ),
    ]);
    // `u` may have changed `k` and set anything.
    assert!(r.diagnostics.is_empty(), "{:?}", codes(&r));
    let names: Vec<&str> = r.outputs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["a", "r.x", "r._other", "u"]);
}

#[test]
fn a_cycle_leaves_its_stages_out_instead_of_looping() {
    let r = run(&[
        stage("a", StageKind::Transform, &["b"], Flow::pass()),
        stage("b", StageKind::Transform, &["a"], Flow::pass()),
    ]);
    assert!(r.outputs.is_empty());
}

/// A sink that names events by their source position is refused where a
/// source reaches it two ways (a fan-out that joins again, a route's two
/// outputs), and accepted where each source has one way, however many
/// sources there are or stages between.
#[test]
fn naming_by_position_needs_one_way_from_each_source() {
    let placed = || {
        Flow::raw().then(Step::Replay(Replay {
            rereads: true,
            positions: true,
        }))
    };
    let names = || {
        Flow::pass().then(Step::NamesByPosition {
            option: vec!["id_from_position".into()],
        })
    };
    let one_way = run(&[
        stage("a", StageKind::Source, &[], placed()),
        stage("b", StageKind::Source, &[], placed()),
        stage(
            "parse",
            StageKind::Parser,
            &["a"],
            Flow::pass().then(Step::EmitAny),
        ),
        stage("out", StageKind::Sink, &["parse", "b"], names()),
        stage("copy", StageKind::Sink, &["a"], Flow::pass()),
    ]);
    assert_eq!(codes(&one_way), []);

    let mut routed = stage("route", StageKind::Transform, &["a"], Flow::pass());
    routed.outputs = vec!["x".into(), "y".into()];
    let two_ways = run(&[
        stage("a", StageKind::Source, &[], placed()),
        stage("b", StageKind::Source, &[], placed()),
        routed,
        stage("left", StageKind::Parser, &["route.x"], Flow::pass()),
        stage("out", StageKind::Sink, &["left", "route.y", "b"], names()),
    ]);
    assert_eq!(
        codes(&two_ways),
        [("position-names-twice", "out".to_string())]
    );
    let message = &two_ways.diagnostics[0].message;
    assert!(message.contains("`a` (2 ways)"), "{message}");
    assert!(!message.contains("`b`"), "{message}");
    assert!(message.contains("`id_from_position`"), "{message}");
    assert_eq!(two_ways.diagnostics[0].line, Some(1), "at the option");
    // A source that gives no positions: a warning naming it.
    let unplaced = run(&[
        stage("a", StageKind::Source, &[], placed()),
        stage("gen", StageKind::Source, &[], Flow::raw()),
        stage("out", StageKind::Sink, &["a", "gen"], names()),
    ]);
    assert_eq!(codes(&unplaced), [("position-missing", "out".to_string())]);
    let message = &unplaced.diagnostics[0].message;
    assert!(message.contains("`gen` gives its events none"), "{message}");
    assert!(!message.contains("`a`"), "{message}");
    // What validate prints per sink: effectively once from a source
    // with positions, at least once from one that re-reads without them,
    // at most once from one that cannot.
    let rereads = || {
        Flow::raw().then(Step::Replay(Replay {
            rereads: true,
            positions: false,
        }))
    };
    let r = run(&[
        stage("tail", StageKind::Source, &[], placed()),
        stage("journal", StageKind::Source, &[], rereads()),
        stage("gen", StageKind::Source, &[], Flow::raw()),
        stage(
            "named",
            StageKind::Sink,
            &["tail", "journal", "gen"],
            names(),
        ),
        stage("plain", StageKind::Sink, &["tail"], Flow::pass()),
    ]);
    let mut guarantees: Vec<(String, String, Guarantee)> = r
        .deliveries
        .iter()
        .flat_map(|d| {
            d.sources
                .iter()
                .map(|(source, reach)| (d.sink.clone(), source.clone(), d.guarantee(reach)))
        })
        .collect();
    guarantees.sort();
    let g = |sink: &str, source: &str, guarantee| (sink.to_string(), source.to_string(), guarantee);
    assert_eq!(
        guarantees,
        [
            g("named", "gen", Guarantee::AtMostOnce),
            g("named", "journal", Guarantee::AtLeastOnce),
            g("named", "tail", Guarantee::EffectivelyOnce),
            g("plain", "tail", Guarantee::AtLeastOnce),
        ]
    );
}
