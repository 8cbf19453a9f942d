//! The codecs as the stages a pipeline builds from options: each option
//! reaches the codec, bad options are refused by key, and a stage given the
//! wrong kind of event says so (the codec functions themselves are
//! property-tested in `codecs.rs`).

use logbus_plugin_api::testing;
use logbus_plugin_api::{Built, Bytes, Event, Meta, Plugin, Processor, Typed, Verdict};
use serde_json::{Value, json};

use logbus_codec::csv_codec::{CsvFormatter, CsvParser};
use logbus_codec::kv::{KvFormatter, KvParser};
use logbus_codec::regex_parser::RegexParser;
use logbus_codec::syslog::{SyslogFormatter, SyslogParser};
use logbus_codec::yaml::{YamlFormatter, YamlParser};

fn build(plugin: &dyn Plugin, options: Value) -> Box<dyn Processor> {
    match plugin.build(&options, &testing::context()) {
        Ok(Built::Processor(p)) => p,
        Ok(_) => panic!("not a processor"),
        Err(e) => panic!("{e:?}"),
    }
}

fn raw(text: &str) -> Event {
    Event::raw(Bytes::from(text.to_string()), Meta::at("t", 7))
}

fn parsed(v: Value) -> Event {
    Event::fields(v.as_object().unwrap().clone(), Meta::at("t", 7))
}

/// The fields a parser made of `text`, or its error.
fn parse(p: &mut Box<dyn Processor>, text: &str) -> Result<Value, String> {
    let mut e = raw(text);
    match p.process(&mut e) {
        Ok(Verdict::Keep) => Ok(Value::Object(e.as_fields().expect("fields").clone())),
        Ok(other) => panic!("{other:?}"),
        Err(err) => Err(err.to_string()),
    }
}

/// The text a formatter made of `fields`, or its error.
fn format(p: &mut Box<dyn Processor>, fields: Value) -> Result<String, String> {
    let mut e = parsed(fields);
    match p.process(&mut e) {
        Ok(Verdict::Keep) => Ok(String::from_utf8(e.as_raw().expect("raw").to_vec()).unwrap()),
        Ok(other) => panic!("{other:?}"),
        Err(err) => Err(err.to_string()),
    }
}

/// A parser refuses a parsed event and a formatter a raw one, naming itself.
#[test]
fn each_stage_names_itself_when_given_the_wrong_kind_of_event() {
    let parsers: [(&dyn Plugin, Value, &str); 5] = [
        (&Typed(KvParser), json!({}), "kv"),
        (&Typed(SyslogParser), json!({}), "syslog"),
        (&Typed(CsvParser), json!({ "columns": ["a"] }), "csv"),
        (
            &Typed(RegexParser),
            json!({ "pattern": "(?P<a>.)" }),
            "regex",
        ),
        (&Typed(YamlParser), json!({}), "yaml"),
    ];
    for (plugin, options, name) in parsers {
        let mut p = build(plugin, options);
        let err = p.process(&mut parsed(json!({ "a": 1 }))).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("the {name} parser needs a raw event; this one is already parsed")
        );
    }
    let formatters: [(&dyn Plugin, Value, &str); 4] = [
        (&Typed(KvFormatter), json!({}), "kv"),
        (&Typed(SyslogFormatter), json!({}), "syslog"),
        (&Typed(CsvFormatter), json!({ "columns": ["a"] }), "csv"),
        (&Typed(YamlFormatter), json!({}), "yaml"),
    ];
    for (plugin, options, name) in formatters {
        let mut p = build(plugin, options);
        let err = p.process(&mut raw("a=1")).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("the {name} formatter needs a parsed event; add a parser before it")
        );
    }
}

#[test]
fn kv_stages_use_their_separator_delimiter_and_types() {
    let mut p = build(&Typed(KvParser), json!({}));
    assert_eq!(
        parse(&mut p, "a=1 b=x\tflag").unwrap(),
        json!({ "a": 1, "b": "x", "flag": true })
    );
    let mut p = build(
        &Typed(KvParser),
        json!({ "separator": ";", "delimiter": ":", "types": "string" }),
    );
    assert_eq!(
        parse(&mut p, "a:1;b:two words").unwrap(),
        json!({ "a": "1", "b": "two words" })
    );
    let err = parse(&mut p, "a:\"open").unwrap_err();
    assert!(
        err.starts_with("not key=value: a quote that is never closed (at byte 2)"),
        "{err}"
    );

    let mut f = build(&Typed(KvFormatter), json!({}));
    assert_eq!(
        format(&mut f, json!({ "a": 1, "b": "two words" })).unwrap(),
        "a=1 b=\"two words\""
    );
    let mut f = build(
        &Typed(KvFormatter),
        json!({ "separator": ";", "delimiter": ":", "types": "string" }),
    );
    // With `types: string` a string that looks like a number needs no
    // quotes; with `auto` it does.
    assert_eq!(
        format(&mut f, json!({ "a": "1", "b": "1.5" })).unwrap(),
        "a:1;b:1.5"
    );
    let mut f = build(&Typed(KvFormatter), json!({}));
    assert_eq!(format(&mut f, json!({ "a": "1" })).unwrap(), "a=\"1\"");
}

#[test]
fn kv_options_are_refused_by_key() {
    for plugin in [&Typed(KvParser) as &dyn Plugin, &Typed(KvFormatter)] {
        for (options, said) in [
            (
                json!({ "separator": "" }),
                "separator: must be one ASCII character other than `\"` and `\\`, got \"\"",
            ),
            (
                json!({ "separator": "ab" }),
                "separator: must be one ASCII character",
            ),
            (
                json!({ "delimiter": "\"" }),
                "delimiter: must be one ASCII character",
            ),
            (
                json!({ "delimiter": "\\" }),
                "delimiter: must be one ASCII character",
            ),
            (
                json!({ "separator": ":", "delimiter": ":" }),
                "delimiter: must differ from `separator`",
            ),
        ] {
            let errors = testing::option_errors(plugin, options.clone());
            assert!(errors.starts_with(said), "{options}: {errors}");
        }
        assert_eq!(
            testing::option_errors(plugin, json!({ "separator": ",", "delimiter": ":" })),
            ""
        );
    }
}

#[test]
fn csv_stages_use_their_columns_delimiter_and_types() {
    // Columns from the header record, which is not an event.
    let mut p = build(&Typed(CsvParser), json!({}));
    let mut header = raw("n,name");
    assert!(matches!(p.process(&mut header).unwrap(), Verdict::Discard));
    assert_eq!(
        parse(&mut p, "1,ann").unwrap(),
        json!({ "n": "1", "name": "ann" })
    );
    // Given columns, a delimiter and typed values.
    let mut p = build(
        &Typed(CsvParser),
        json!({ "columns": ["n", "ok"], "delimiter": ";", "types": "auto" }),
    );
    assert_eq!(
        parse(&mut p, "1;true").unwrap(),
        json!({ "n": 1, "ok": true })
    );
    // An empty value stays an empty string (not null, as in `kv`); line
    // ends after the record are not a second one.
    assert_eq!(
        parse(&mut p, "1;\r\n\r\n").unwrap(),
        json!({ "n": 1, "ok": "" })
    );
    assert_eq!(
        parse(&mut p, "1;true\n2;false").unwrap_err(),
        "not CSV: more than one record in the event (at byte 7)"
    );
    assert_eq!(
        parse(&mut p, "1;2;3").unwrap_err(),
        "not CSV: 3 values for 2 columns (at byte 0)"
    );

    let mut f = build(
        &Typed(CsvFormatter),
        json!({ "columns": ["b", "a"], "delimiter": "|" }),
    );
    assert_eq!(
        format(&mut f, json!({ "a": 1, "b": "x|y" })).unwrap(),
        "\"x|y\"|1"
    );
}

#[test]
fn csv_options_are_refused_by_key() {
    for plugin in [&Typed(CsvParser) as &dyn Plugin, &Typed(CsvFormatter)] {
        for (options, said) in [
            (
                json!({ "columns": ["a"], "delimiter": "" }),
                "delimiter: must be one ASCII character other than `\"`, got \"\"",
            ),
            (
                json!({ "columns": ["a"], "delimiter": ";;" }),
                "delimiter: must be one ASCII character",
            ),
            (
                json!({ "columns": ["a"], "delimiter": "\"" }),
                "delimiter: must be one ASCII character",
            ),
            (
                json!({ "columns": [] }),
                "columns: must name at least one column",
            ),
            (
                json!({ "columns": ["a", "b", "a"] }),
                "columns.2: `a` appears twice",
            ),
        ] {
            let errors = testing::option_errors(plugin, options.clone());
            assert!(errors.starts_with(said), "{options}: {errors}");
        }
        assert_eq!(
            testing::option_errors(plugin, json!({ "columns": ["a", "b"], "delimiter": "\t" })),
            ""
        );
    }
    assert_eq!(
        testing::option_errors(&Typed(CsvFormatter), json!({})),
        "columns: the csv formatter needs `columns`"
    );
}

#[test]
fn the_regex_parser_keeps_the_named_captures_that_took_part() {
    let mut p = build(
        &Typed(RegexParser),
        json!({ "pattern": r"^(?P<level>\w+)(?: (?P<code>\d+))?: (?P<msg>.*)$" }),
    );
    assert_eq!(
        parse(&mut p, "warn 42: disk full").unwrap(),
        json!({ "level": "warn", "code": "42", "msg": "disk full" })
    );
    assert_eq!(
        parse(&mut p, "info: ok").unwrap(),
        json!({ "level": "info", "msg": "ok" })
    );
    assert_eq!(
        parse(&mut p, "no colon here").unwrap_err(),
        "the line does not match `pattern`"
    );
    let mut e = Event::raw(Bytes::from_static(b"ok\xff"), Meta::at("t", 7));
    assert_eq!(
        p.process(&mut e).unwrap_err().to_string(),
        "invalid UTF-8 at byte 2"
    );
    assert!(
        testing::option_errors(&Typed(RegexParser), json!({ "pattern": "(" }))
            .starts_with("pattern: not a valid regex: ")
    );
    assert_eq!(
        testing::option_errors(&Typed(RegexParser), json!({ "pattern": "(a)" })),
        "pattern: has no named capture; name what you want as fields: (?P<name>...)"
    );
}

#[test]
fn syslog_stages_follow_their_format_option() {
    let line = "<34>1 2003-10-11T22:14:15.003Z host app - ID47 - hello";
    let mut auto = build(&Typed(SyslogParser), json!({}));
    let fields = parse(&mut auto, line).unwrap();
    assert_eq!(fields["hostname"], "host");
    assert_eq!(fields["message"], "hello");
    // Told RFC 3164, the same line is read the old way.
    let mut old = build(&Typed(SyslogParser), json!({ "format": "rfc3164" }));
    assert_ne!(parse(&mut old, line).unwrap(), fields);
    let err = parse(&mut auto, "no pri").unwrap_err();
    assert!(err.starts_with("not syslog: "), "{err}");

    // A missing timestamp is written as now, to the microsecond.
    let mut f = build(&Typed(SyslogFormatter), json!({}));
    let before = chrono::Utc::now();
    let text = format(&mut f, json!({ "message": "hi" })).unwrap();
    let stamp = text.split(' ').nth(1).unwrap();
    let written = chrono::DateTime::parse_from_rfc3339(stamp).unwrap();
    assert!(
        written >= before - chrono::Duration::microseconds(1),
        "{text}"
    );
    assert_eq!(stamp.len(), "2026-12-04T13:00:00.000000Z".len(), "{text}");
    assert!(text.ends_with(" hi"), "{text}");
}

#[test]
fn the_yaml_parser_splits_streams_and_wraps_what_is_not_a_mapping() {
    let mut p = build(&Typed(YamlParser), json!({}));
    assert_eq!(
        parse(&mut p, "a: 1\nb: [x]\n").unwrap(),
        json!({ "a": 1, "b": ["x"] })
    );
    let mut stream = raw("---\na: 1\n---\na: 2\n");
    match p.process(&mut stream).unwrap() {
        Verdict::Replace(events) => {
            let got: Vec<Value> = events
                .iter()
                .map(|e| Value::Object(e.as_fields().unwrap().clone()))
                .collect();
            assert_eq!(got, [json!({ "a": 1 }), json!({ "a": 2 })]);
            assert!(events.iter().all(|e| e.meta().source.as_ref() == "t"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        parse(&mut p, "a: 1\n---\n- x\n").unwrap_err(),
        "not a YAML mapping: document 1 (use `wrap_field` to keep other values)"
    );
    let err = parse(&mut p, "a: [").unwrap_err();
    assert!(err.starts_with("not YAML: "), "{err}");
    let mut wrap = build(&Typed(YamlParser), json!({ "wrap_field": "doc" }));
    assert_eq!(parse(&mut wrap, "- x\n").unwrap(), json!({ "doc": ["x"] }));
    assert_eq!(parse(&mut wrap, "a: 1\n").unwrap(), json!({ "a": 1 }));

    let mut f = build(&Typed(YamlFormatter), json!({}));
    assert_eq!(format(&mut f, json!({ "a": 1 })).unwrap(), "---\na: 1\n");
}
