//! The JS transform on real QuickJS: results, errors, limits, isolation.
#![cfg(feature = "transform-js")]

use std::time::{Duration, Instant};

use logbus_js::transform::{JsTransform, syntax_check};
use logbus_plugin_api::{
    BuildContext, Built, Event, Meta, Plugin, Processor, Typed, Verdict, serde_json,
};
use serde_json::{Value, json};

fn cx(dir: &std::path::Path) -> BuildContext {
    BuildContext {
        stage_id: "enrich".into(),
        base_dir: dir.to_path_buf(),
        worker: 3,
    }
}

fn build(options: Value) -> Box<dyn Processor> {
    match Typed(JsTransform).build(&options, &cx(std::path::Path::new("."))) {
        Ok(Built::Processor(p)) => p,
        Ok(_) => panic!("not a processor"),
        Err(e) => panic!("{e:?}"),
    }
}

fn build_err(options: Value) -> String {
    match Typed(JsTransform).build(&options, &cx(std::path::Path::new("."))) {
        Err(e) => format!("{}: {}", e[0].path.join("."), e[0].message),
        Ok(_) => panic!("expected an error"),
    }
}

fn event(v: Value) -> Event {
    Event::fields(v.as_object().unwrap().clone(), Meta::at("t", 7))
}

fn fields(e: &Event) -> Value {
    Value::Object(e.as_fields().unwrap().clone())
}

const ISSUE_SCRIPT: &str = r#"
function process(event, ctx) {
  if (event.level === "debug") return null;          // drop
  event.sev = { info: 6, warn: 4, error: 3 }[event.level] ?? 7;
  delete event.pad;
  return event;
}
"#;

#[test]
fn the_documented_script_drops_maps_and_deletes() {
    let mut p = build(json!({ "script": ISSUE_SCRIPT }));
    let mut e = event(json!({"seq": 1, "level": "debug", "pad": "x"}));
    assert!(matches!(p.process(&mut e), Ok(Verdict::Discard)));
    let mut e = event(
        json!({"seq": 2, "level": "warn", "pad": "x", "user": {"id": "u1"}, "tags": ["a", 1, 2.5, true, null]}),
    );
    assert!(matches!(p.process(&mut e), Ok(Verdict::Keep)));
    assert_eq!(
        fields(&e),
        json!({"seq": 2, "level": "warn", "user": {"id": "u1"}, "tags": ["a", 1, 2.5, true, null], "sev": 4})
    );
    assert_eq!(e.meta().ingest_ns, 7, "metadata is kept");
    let mut e = event(json!({"level": "trace"}));
    p.process(&mut e).unwrap();
    assert_eq!(fields(&e)["sev"], 7);
}

/// Every field is read into JS and written back (the event object
/// converts only what a script touches): integers beyond 32 bits stay
/// exact, floats stay floats.
#[test]
fn numbers_keep_their_kind_through_the_script() {
    let mut p = build(
        json!({ "script": "function process(e) { for (const k of Object.keys(e)) e[k] = e[k]; e.sum = e.big - 1 + e.neg; return e; }" }),
    );
    let mut e = event(
        json!({"i": 5, "big": 9007199254740991i64, "neg": -3_000_000_000i64, "f": 380.712, "z": 0.5}),
    );
    p.process(&mut e).unwrap();
    assert_eq!(
        fields(&e),
        json!({"i": 5, "big": 9007199254740991i64, "neg": -3_000_000_000i64, "f": 380.712, "z": 0.5, "sum": 9007196254740990i64})
    );
}

#[test]
fn an_array_result_splits_and_other_results_are_errors() {
    let mut p = build(
        json!({ "script": "function process(e) { return e.n === 1 ? [{a: 1}, {a: 2, f: () => 1, u: undefined}] : e.n === 2 ? 42 : e.n === 3 ? [1] : e.n === 4 ? 'x' : {} }" }),
    );
    match p.process(&mut event(json!({"n": 1}))) {
        Ok(Verdict::Replace(v)) => {
            let got: Vec<Value> = v.iter().map(fields).collect();
            assert_eq!(
                got,
                vec![json!({"a": 1}), json!({"a": 2})],
                "functions and undefined are left out"
            );
        }
        other => panic!("{other:?}"),
    }
    let err = p.process(&mut event(json!({"n": 2}))).unwrap_err();
    assert!(
        err.0
            .contains("returned a number; expected an object, null or an array of objects"),
        "{err}"
    );
    let err = p.process(&mut event(json!({"n": 3}))).unwrap_err();
    assert!(err.0.contains("item 0 is a number"), "{err}");
    // Arrays, functions and promises are objects to QuickJS, not events.
    let mut q = build(json!({ "script": r#"
        function process(e) {
          return [{}, [[1], () => 1, Promise.resolve(1)][e.n]];
        }
    "# }));
    for (n, kind) in ["an array", "a function", "a Promise"].iter().enumerate() {
        let err = q.process(&mut event(json!({"n": n}))).unwrap_err();
        assert!(err.0.contains(&format!("item 1 is {kind}")), "{err}");
    }
    let err = p.process(&mut event(json!({"n": 4}))).unwrap_err();
    assert!(err.0.contains("returned a string"), "{err}");
}

#[test]
fn a_throw_is_an_event_error_with_the_script_line() {
    let mut p = build(
        json!({ "script": "function process(e) {\n  if (e.bad) {\n    throw new TypeError('no good: ' + e.bad);\n  }\n  return e;\n}" }),
    );
    let err = p.process(&mut event(json!({"bad": "x"}))).unwrap_err();
    assert!(err.0.contains("TypeError: no good: x"), "{err}");
    assert!(err.0.contains("line 3"), "{err}");
    // The worker goes on.
    assert!(matches!(
        p.process(&mut event(json!({}))),
        Ok(Verdict::Keep)
    ));
}

#[test]
fn a_runaway_script_is_stopped_at_the_timeout_and_the_worker_goes_on() {
    let mut p = build(json!({
        "script": "function process(e) { if (e.spin) { while (true) {} } return e; }",
        "timeout_ms": 30
    }));
    let started = Instant::now();
    let err = p.process(&mut event(json!({"spin": true}))).unwrap_err();
    assert!(err.0.contains("ran past timeout_ms (30 ms)"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "stopped, not hung"
    );
    assert!(matches!(
        p.process(&mut event(json!({}))),
        Ok(Verdict::Keep)
    ));
}

#[test]
fn a_try_catch_cannot_swallow_the_timeout() {
    let mut p = build(json!({
        "script": "function process(e) { try { while (true) {} } catch (x) { return {caught: true}; } }",
        "timeout_ms": 20
    }));
    let err = p.process(&mut event(json!({}))).unwrap_err();
    assert!(err.0.contains("timeout_ms"), "{err}");
}

#[test]
fn memory_beyond_the_limit_is_an_event_error_and_the_worker_goes_on() {
    let mut p = build(json!({
        "script": "function process(e) { if (e.huge) { return { s: 'x'.repeat(256 * 1024 * 1024) }; } if (e.hog) { const a = []; while (true) a.push('x'.repeat(1024) + a.length); } return e; }",
        "memory_limit_mb": 8,
        "timeout_ms": 10000
    }));
    for _ in 0..10 {
        let err = p.process(&mut event(json!({"hog": true}))).unwrap_err();
        assert!(
            err.0.contains("ran out of memory (memory_limit_mb: 8)"),
            "{err}"
        );
        assert!(matches!(
            p.process(&mut event(json!({"ok": 1}))),
            Ok(Verdict::Keep)
        ));
    }
    let err = p.process(&mut event(json!({"huge": true}))).unwrap_err();
    assert!(
        err.0.contains("memory"),
        "one allocation past the limit: {err}"
    );
    assert!(matches!(
        p.process(&mut event(json!({"ok": 1}))),
        Ok(Verdict::Keep)
    ));
}

#[test]
fn init_runs_once_per_worker_and_module_state_persists() {
    let mut p = build(
        json!({ "script": "let n = 0; let who; function init(ctx) { who = ctx.stage + '#' + ctx.worker; ctx.log('ready'); } function process(e, ctx) { n += 1; e.n = n; e.who = who; ctx.log('event ' + n); return e; }" }),
    );
    let mut a = event(json!({}));
    let mut b = event(json!({}));
    p.process(&mut a).unwrap();
    p.process(&mut b).unwrap();
    assert_eq!(fields(&a), json!({"n": 1, "who": "enrich#3"}));
    assert_eq!(fields(&b), json!({"n": 2, "who": "enrich#3"}));
}

#[test]
fn scripts_have_no_host_access() {
    let mut p = build(
        json!({ "script": "function process(e) { return { t: [typeof require, typeof std, typeof os, typeof fetch, typeof process.env, typeof XMLHttpRequest, typeof Deno] }; }" }),
    );
    let mut e = event(json!({}));
    p.process(&mut e).unwrap();
    assert_eq!(fields(&e)["t"], json!(vec!["undefined"; 7]));
}

#[test]
fn a_reference_cycle_is_an_error_not_a_crash() {
    let mut p = build(json!({ "script": "function process(e) { e.self = e; return e; }" }));
    let err = p.process(&mut event(json!({}))).unwrap_err();
    assert!(err.0.contains("contains itself"), "{err}");
}

#[test]
fn raw_events_arrive_as_message() {
    let mut p =
        build(json!({ "script": "function process(e) { return { len: e.message.length }; }" }));
    let mut e = Event::raw("hello", Meta::at("t", 0));
    p.process(&mut e).unwrap();
    assert_eq!(fields(&e), json!({"len": 5}));
}

#[test]
fn syntax_errors_name_line_and_column() {
    let err = syntax_check("function process(e) {\n  return e;\n  let = ;\n}").unwrap_err();
    assert!(err.contains("line 3"), "{err}");
    assert!(err.contains("column"), "{err}");
    assert!(err.contains("SyntaxError"), "{err}");
    // Compiling does not run the script.
    syntax_check("while (true) {}").unwrap();
}

/// `logbus validate`'s check: the script compiles (strict, as it runs),
/// and its file can be read; each error names the option.
#[test]
fn the_check_compiles_the_script_and_names_the_option() {
    let check = |options: Value| {
        Typed(JsTransform)
            .check(&options, &cx(std::path::Path::new(".")))
            .into_iter()
            .map(|e| format!("{}: {}", e.path.join("."), e.message))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        check(json!({ "script": "function process(e) { return e; }" })),
        Vec::<String>::new()
    );
    let errors = check(json!({ "script": "function process(e) {\n  return e +;\n}" }));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("script: syntax error at script line 2"),
        "{errors:?}"
    );
    let errors = check(json!({ "file": "no-such-file.js" }));
    assert!(errors[0].starts_with("file: cannot read"), "{errors:?}");
    // Strict mode, as at run time: `with` is a syntax error there.
    let errors = check(json!({ "script": "function process(e) { with (e) { return a; } }" }));
    assert!(
        errors.iter().any(|e| e.contains("SyntaxError")),
        "{errors:?}"
    );
}

/// Hostile text for the syntax check: nesting deep enough to overflow a
/// native stack is a clear error within the check's stack limit.
#[test]
fn deep_nesting_in_a_script_is_a_syntax_error_not_a_crash() {
    let deep = format!("{}1{}", "(".repeat(100_000), ")".repeat(100_000));
    let err = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || syntax_check(&deep))
        .unwrap()
        .join()
        .expect("the check did not crash")
        .unwrap_err();
    assert!(err.contains("Maximum call stack size exceeded"), "{err}");
}

/// Where QuickJS says nothing of the position in the stack trace, the
/// error's own `lineNumber` and `columnNumber` are used (a zero is no
/// position).
#[test]
fn an_error_s_own_line_and_column_are_used_without_a_stack() {
    let mut p = build(json!({ "script": r#"
        function process(e) {
          const err = new Error("placed");
          Object.defineProperty(err, "stack", { value: undefined });
          err.lineNumber = e.line;
          err.columnNumber = e.column;
          throw err;
        }
    "# }));
    let mut threw = |line: i32, column: i32| {
        p.process(&mut event(json!({"line": line, "column": column})))
            .unwrap_err()
            .0
    };
    assert_eq!(
        threw(7, 3),
        "process() threw at script line 7, column 3: Error: placed"
    );
    assert_eq!(
        threw(7, 0),
        "process() threw at script line 7: Error: placed"
    );
    assert_eq!(threw(0, 3), "process() threw: Error: placed");
}

/// A result nested exactly as deep as allowed is read; one level more is
/// an error; so are cycles through plain objects and arrays (which would
/// otherwise recurse without end).
#[test]
fn results_are_read_to_128_levels_and_cycles_are_errors() {
    let mut p = build(json!({ "script": r#"
        function process(e) {
          if (e.cycle === "object") { const o = {}; o.o = o; return { x: o }; }
          if (e.cycle === "array") { const a = []; a.push(a); return { x: a }; }
          let v = 1;
          for (let i = 0; i < e.levels; i++) v = e.arrays ? [v] : { v };
          return { x: v };
        }
    "# }));
    for arrays in [false, true] {
        let ok = p.process(&mut event(json!({"levels": 127, "arrays": arrays})));
        assert!(
            matches!(ok, Ok(Verdict::Keep)),
            "127 levels, arrays {arrays}: {ok:?}"
        );
        let err = p
            .process(&mut event(json!({"levels": 128, "arrays": arrays})))
            .unwrap_err();
        assert!(
            err.0.contains("more than 128 levels"),
            "arrays {arrays}: {err}"
        );
    }
    for cycle in ["object", "array"] {
        let err = p.process(&mut event(json!({"cycle": cycle}))).unwrap_err();
        assert!(err.0.contains("more than 128 levels"), "{cycle}: {err}");
    }
}

/// Numbers read back as JSON would write them: integral values below 2^53
/// as integers, others as floats, non-finite ones as null.
#[test]
fn numbers_read_back_as_integers_floats_or_null() {
    let mut p = build(json!({ "script": r#"
        function process(e) {
          return { a: 2 ** 40, b: 0.5, c: 2 ** 53, d: 1e300, e: Infinity, f: NaN, g: -(2 ** 40), h: 2 ** 53 - 1 };
        }
    "# }));
    let mut e = event(json!({}));
    p.process(&mut e).unwrap();
    let mut out = Vec::new();
    assert!(e.payload().write_json(&mut out));
    assert_eq!(
        String::from_utf8(out).unwrap(),
        r#"{"a":1099511627776,"b":0.5,"c":9007199254740992.0,"d":1e+300,"e":null,"f":null,"g":-1099511627776,"h":9007199254740991}"#
    );
}

#[test]
fn build_errors_say_what_is_missing() {
    assert!(
        build_err(json!({ "script": "function init() {}" }))
            .contains("defines no `process(event, ctx)`")
    );
    assert!(build_err(json!({ "script": "throw new Error('boom')" })).contains("boom"));
    assert!(build_err(json!({ "script": "function init() { throw new Error('init boom') } function process(e) { return e }" })).contains("init() failed"));
    assert!(build_err(json!({})).contains("`script:`"));
    assert!(build_err(json!({ "script": "x", "file": "y.js" })).starts_with("file: "));
    let e = build_err(json!({ "file": "no-such-file.js" }));
    assert!(e.starts_with("file: cannot read"), "{e}");
}

#[test]
fn a_script_file_resolves_against_the_pipeline_directory() {
    let dir = std::env::temp_dir().join(format!("logbus-js-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("scripts")).unwrap();
    std::fs::write(
        dir.join("scripts/tag.js"),
        "function process(e) { e.tagged = true; return e; }",
    )
    .unwrap();
    let built = Typed(JsTransform).build(&json!({ "file": "scripts/tag.js" }), &cx(&dir));
    let Ok(Built::Processor(mut p)) = built else {
        panic!("build failed")
    };
    let mut e = event(json!({}));
    p.process(&mut e).unwrap();
    assert_eq!(fields(&e), json!({"tagged": true}));
    let errors = Typed(JsTransform).check(&json!({ "file": "scripts/tag.js" }), &cx(&dir));
    assert!(errors.is_empty(), "{errors:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The event is a lazy view: what scripts can do with a plain object works
/// the same on it.
#[test]
fn the_lazy_event_behaves_like_a_plain_object() {
    let mut p = build(json!({ "script": r#"
        let kept;
        function process(e) {
          if (e.mode === "stale") { return { v: kept.a }; }
          kept = e;
          const before = Object.keys(e).join(",");
          e.user.plan = "pro";             // nested change, in place
          e.added = 1;
          delete e.b;
          e.gone = undefined;              // undefined removes, as in JSON
          return {
            before,
            after: Object.keys(e).join(","),
            json: JSON.stringify(e),
            has: ["a" in e, "b" in e, "added" in e, Object.prototype.hasOwnProperty.call(e, "a")],
            spread: { ...e },
            entries: Object.entries(e).length,
          };
        }
    "# }));
    let mut e = event(json!({"a": 1, "b": 2, "user": {"plan": "free"}, "gone": 3}));
    p.process(&mut e).unwrap();
    let out = fields(&e);
    assert_eq!(out["before"], "a,b,user,gone");
    assert_eq!(out["after"], "a,user,gone,added", "as on a plain object");
    assert_eq!(out["json"], r#"{"a":1,"user":{"plan":"pro"},"added":1}"#);
    assert_eq!(out["has"], json!([true, false, true, true]));
    assert_eq!(
        out["spread"],
        json!({"a": 1, "user": {"plan": "pro"}, "added": 1})
    );
    assert_eq!(out["entries"], 4);
    // An event kept from an earlier call cannot be read later.
    let err = p.process(&mut event(json!({"mode": "stale"}))).unwrap_err();
    assert!(err.0.contains("belongs to an earlier call"), "{err}");
}

#[test]
fn changes_to_the_returned_event_keep_field_order() {
    let mut p = build(
        json!({ "script": "function process(e) { e.user.id = 'u2'; e.level = 'warn'; e.z = 0; delete e.debug_id; return e; }" }),
    );
    let mut e = event(
        json!({"seq": 1, "level": "info", "debug_id": "x", "user": {"id": "u1"}, "msg": "m"}),
    );
    p.process(&mut e).unwrap();
    let keys: Vec<&String> = e.as_fields().unwrap().keys().collect();
    assert_eq!(keys, ["seq", "level", "user", "msg", "z"]);
    assert_eq!(
        fields(&e),
        json!({"seq": 1, "level": "warn", "user": {"id": "u2"}, "msg": "m", "z": 0})
    );
}

#[test]
fn the_event_can_be_returned_with_others() {
    let mut p =
        build(json!({ "script": "function process(e) { return [e, { ...e, copy: true }]; }" }));
    match p.process(&mut event(json!({"a": 1}))) {
        Ok(Verdict::Replace(v)) => {
            let got: Vec<Value> = v.iter().map(fields).collect();
            assert_eq!(got, vec![json!({"a": 1}), json!({"a": 1, "copy": true})]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_shared_event_is_not_changed_for_other_readers() {
    let mut p = build(json!({ "script": "function process(e) { e.a = 2; return e; }" }));
    let original = event(json!({"a": 1}));
    let mut mine = original.clone();
    p.process(&mut mine).unwrap();
    assert_eq!(fields(&mine), json!({"a": 2}));
    assert_eq!(
        fields(&original),
        json!({"a": 1}),
        "fan-out copies on write"
    );
}

/// Runs `process` on an empty event in a thread and gives up (failing the
/// test rather than hanging it) after 20 s.
fn process_within(script: &str, timeout_ms: u64) -> Result<Verdict, String> {
    let script = script.to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut p =
            build(json!({"script": script, "timeout_ms": timeout_ms, "memory_limit_mb": 32}));
        let first = p.process(&mut event(json!({}))).map_err(|e| e.0);
        // The worker is still usable afterwards.
        let mut ok = event(json!({"ok": 1}));
        let again = p.process(&mut ok).map_err(|e| e.0);
        let _ = tx.send((
            first,
            again.is_ok() || again.as_ref().is_err_and(|e| !e.contains("panicked")),
        ));
    });
    let (first, usable) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the call hung past 20 s");
    assert!(usable, "the worker is usable after {first:?}");
    first
}

/// Sparse arrays: a length costs QuickJS nothing, but read back naively
/// it is a `Vec` of that many values (154 GB for 2³¹−1, an abort).
#[test]
fn sparse_arrays_are_refused_within_the_memory_limit() {
    for length in ["2**31 - 1", "1e8", "2**32 - 1"] {
        for (how, body) in [
            (
                "set on the event",
                format!("const a = []; a.length = {length}; e.big = a; return e;"),
            ),
            (
                "in a new object",
                format!("const a = []; a.length = {length}; return {{big: a}};"),
            ),
            (
                "as the result",
                format!("const a = []; a.length = {length}; return a;"),
            ),
        ] {
            let script = format!("function process(e) {{ {body} }}");
            let err = process_within(&script, 1000).unwrap_err();
            eprintln!("{length} {how}: {err}");
            assert!(
                err.contains("memory_limit_mb")
                    || err.contains("timeout_ms")
                    || err.contains("item 0"),
                "{length} {how}: {err}"
            );
        }
    }
}

/// The CPU budget stays armed while the result is read and while an error
/// is described: a getter, a Proxy trap or a thrown object's `toString`
/// that loops is stopped like a loop in `process` itself.
#[test]
fn the_budget_covers_reading_the_result_and_describing_errors() {
    for script in [
        "function process(e) { return { get x() { while (true) {} } }; }",
        "function process(e) { return new Proxy({}, { ownKeys() { while (true) {} } }); }",
        "function process(e) { e.x = { get y() { while (true) {} } }; return e; }",
        "function process(e) { throw { toString() { while (true) {} } }; }",
        "function process(e) { const x = new Error('m'); Object.defineProperty(x, 'message', { get() { while (true) {} } }); throw x; }",
        "function process(e) { return [{ get z() { while (true) {} } }]; }",
    ] {
        let began = Instant::now();
        let err = process_within(script, 50).unwrap_err();
        assert!(began.elapsed() < Duration::from_secs(10), "{script}");
        assert!(
            err.contains("timeout_ms") || err.contains("interrupted"),
            "{script}: {err}"
        );
    }
}

/// Checking the syntax compiles the script without running any of it,
/// even when the text tries to close a wrapper and run code.
#[test]
fn the_syntax_check_never_runs_the_script() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let check = syntax_check("}); while(true){} (function(){");
        let built = Typed(JsTransform)
            .build(
                &json!({"script": "function process(e) { return e; } while (true) {}", "timeout_ms": 20}),
                &cx(std::path::Path::new(".")),
            )
            .err()
            .map(|e| e[0].message.clone());
        let _ = tx.send((check, built));
    });
    let (check, built) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the syntax check hung");
    assert!(check.unwrap_err().contains("SyntaxError"));
    // Running the top level at build is under the budget too.
    let built = built.expect("an endless top level fails the build");
    assert!(built.contains("timeout_ms"), "{built}");
    // Still: a top level that would loop compiles fine.
    syntax_check("while (true) {}").unwrap();
}

#[test]
fn an_async_or_generator_process_is_refused_at_build() {
    for script in [
        "async function process(e) { return e; }",
        "var process = async (e) => e;",
        "function* process(e) { yield e; }",
        "async function* process(e) { yield e; }",
    ] {
        let err = build_err(json!({ "script": script }));
        assert!(
            err.contains("async") || err.contains("generator"),
            "{script}: {err}"
        );
    }
    // A plain function that returns a promise is an error per event.
    let mut p = build(json!({"script": "function process(e) { return Promise.resolve(e); }"}));
    let err = p.process(&mut event(json!({}))).unwrap_err();
    assert!(err.0.contains("Promise"), "{err}");
}

/// Many small events from one call are charged too: a million empty
/// objects fit QuickJS's heap but not the read-back allowance.
#[test]
fn many_returned_events_are_charged_against_the_memory_limit() {
    let err = process_within(
        "function process(e) { const o = {}; return new Array(1000000).fill(o); }",
        5000,
    )
    .unwrap_err();
    assert!(
        err.contains("more than memory_limit_mb (32 MiB) as event fields"),
        "{err}"
    );
}

#[test]
fn a_third_parameter_receives_the_event_metadata() {
    let mut p = build(json!({"script": r#"
        function process(event, ctx, meta) {
          event.from = meta.source;
          event.file = meta.origin ?? "none";
          event.topic = meta.attributes?.topic ?? "none";
          event.offset = meta.attributes?.offset ?? -1;
          event.trace = meta.attributes?.headers?.trace_id ?? "none";
          event.ms = meta.ingest_ms;
          return event;
        }
    "#}));
    let attributes = json!({"topic": "logs", "offset": 41, "headers": {"trace_id": "t-9"}});
    let mut e = Event::fields(
        json!({"msg": "hi"}).as_object().unwrap().clone(),
        Meta {
            source: "kafka-in".into(),
            ingest_ns: 5_000_000,
            origin: None,
            attributes: Some(std::sync::Arc::new(attributes.as_object().unwrap().clone())),
            position: None,
        },
    );
    assert!(matches!(p.process(&mut e).unwrap(), Verdict::Keep));
    assert_eq!(
        fields(&e),
        json!({"msg": "hi", "from": "kafka-in", "file": "none", "topic": "logs",
               "offset": 41, "trace": "t-9", "ms": 5})
    );
    // Without attributes the object has none; a two-parameter script never
    // sees a third argument.
    let mut plain = event(json!({"msg": "x"}));
    p.process(&mut plain).unwrap();
    assert_eq!(fields(&plain)["topic"], "none");
    let mut two = build(json!({"script":
        "function process(event, ctx) { event.n = arguments.length; return event; }"}));
    let mut e = event(json!({}));
    two.process(&mut e).unwrap();
    assert_eq!(fields(&e)["n"], 2);
}

/// A parsed line kept lazy (its text and edits beside it) gives a script
/// the same event as ordinary fields, and the script's edits land the same
/// way; what the script leaves alone is never parsed.
#[test]
fn a_lazy_event_gives_the_same_results_as_ordinary_fields() {
    use logbus_plugin_api::{Bytes, LazyFields, Payload};
    let line = r#"{"seq":1,"level":"warn","service":"auth","debug_id":"x","user":{"id":"u1","roles":["a"]},"tags":[1,2.5,null],"pad":"yyyy"}"#;
    let scripts = [
        ISSUE_SCRIPT,
        // Upcase, table lookup, delete: the like-for-like peer pipeline.
        r#"const severity = { warn: 4 };
           function process(event) {
             event.severity = severity[event.level] ?? 5;
             event.service = event.service.toUpperCase();
             delete event.debug_id;
             return event;
           }"#,
        // A nested object changed in place, a field set to undefined, a
        // field deleted then set again (it moves last), the keys listed.
        r#"function process(e) {
             e.user.roles.push("b");
             e.pad = undefined;
             delete e.seq;
             const gone = "seq" in e;
             e.seq = 2;
             e.keys = Object.keys(e).join(",");
             e.has = [gone, "seq" in e, "level" in e, "debug_id" in e, "nope" in e, "tags" in e].join(",");
             return e;
           }"#,
        // A copy with more, and the event beside another.
        "function process(e) { return { ...e, copied: true }; }",
        "function process(e) { return [e, { n: e.tags.length }]; }",
    ];
    for script in scripts {
        let mut p = build(json!({ "script": script }));
        let mut eager = event(serde_json::from_str(line).unwrap());
        let lazy_fields = LazyFields::parse(Bytes::from_static(line.as_bytes())).unwrap();
        let mut lazy = Event::new(Payload::Lazy(lazy_fields), Meta::at("t", 7));
        let outcome = |e: &mut Event, p: &mut Box<dyn Processor>| -> Vec<String> {
            let events = match p.process(e).unwrap() {
                Verdict::Keep => vec![e.clone()],
                Verdict::Replace(events) => events,
                other => panic!("{other:?}"),
            };
            events
                .iter()
                .map(|e| {
                    let mut out = Vec::new();
                    assert!(e.payload().write_json(&mut out));
                    String::from_utf8(out).unwrap()
                })
                .collect()
        };
        assert_eq!(
            outcome(&mut lazy, &mut p),
            outcome(&mut eager, &mut p),
            "{script}"
        );
    }
    // `in` answers from the text without converting, and as JS would.
    let mut p = build(json!({ "script": scripts[2] }));
    let lazy_fields = LazyFields::parse(Bytes::from_static(line.as_bytes())).unwrap();
    let mut lazy = Event::new(Payload::Lazy(lazy_fields), Meta::at("t", 7));
    let Verdict::Keep = p.process(&mut lazy).unwrap() else {
        panic!("the script returns its event")
    };
    let mut out = Vec::new();
    assert!(lazy.payload().write_json(&mut out));
    let out = String::from_utf8(out).unwrap();
    assert!(
        out.contains(r#""has":"false,true,true,true,false,true""#),
        "{out}"
    );
    // The event came back: it is still lazy, and nothing was built.
    let mut p = build(json!({ "script": scripts[1] }));
    let lazy_fields = LazyFields::parse(Bytes::from_static(line.as_bytes())).unwrap();
    let mut lazy = Event::new(Payload::Lazy(lazy_fields), Meta::at("t", 7));
    p.process(&mut lazy).unwrap();
    match lazy.payload() {
        Payload::Lazy(l) => assert!(!l.is_built(), "the whole event was parsed"),
        other => panic!("no longer lazy: {other:?}"),
    }
}

/// The event object's edges: what a plain object would do, or a clear
/// error where an event field cannot follow (symbol names, accessors).
#[test]
fn the_event_object_answers_symbols_accessors_and_prototypes_plainly() {
    let mut p = build(json!({ "script": r#"
        function process(e) {
          const sym = Symbol("s");
          const out = {
            proto: Object.getPrototypeOf(e) === Object.prototype,
            isObject: e instanceof Object,
            iterator: typeof e[Symbol.iterator],
            symbolIn: sym in e,
            symbolDelete: delete e[sym],
            ownSymbols: Object.getOwnPropertySymbols(e).length,
            descriptor: Object.getOwnPropertyDescriptor(e, "a"),
            missing: Object.getOwnPropertyDescriptor(e, "zz") === undefined,
          };
          try { e[sym] = 1; out.symbolSet = "allowed"; } catch (x) { out.symbolSet = x.name + ": " + x.message; }
          try { Object.defineProperty(e, "g", { get() { return 1; } }); out.getter = "allowed"; } catch (x) { out.getter = x.name + ": " + x.message; }
          Object.defineProperty(e, "defined", { value: 5, enumerable: true });
          out.keys = Object.keys(e).join(",");
          out.defined = e.defined;
          return out;
        }
    "# }));
    let mut e = event(json!({"a": 1}));
    p.process(&mut e).unwrap();
    let out = fields(&e);
    assert_eq!(out["proto"], true);
    assert_eq!(out["isObject"], true);
    assert_eq!(out["iterator"], "undefined");
    assert_eq!(out["symbolIn"], false);
    assert_eq!(out["symbolDelete"], true);
    assert_eq!(out["ownSymbols"], 0);
    assert_eq!(
        out["descriptor"],
        json!({"value": 1, "writable": true, "enumerable": true, "configurable": true})
    );
    assert_eq!(out["missing"], true);
    assert_eq!(
        out["symbolSet"],
        "TypeError: an event field's name is a string; a symbol cannot be one"
    );
    assert_eq!(
        out["getter"],
        "TypeError: an event field holds a value; it cannot be a getter or setter"
    );
    assert_eq!(out["keys"], "a,defined");
    assert_eq!(out["defined"], 5);
}

/// A name deleted and set again moves last, on the event as on a plain
/// object: in `Object.keys` during the call and in the event written.
#[test]
fn a_field_deleted_and_set_again_moves_last_as_on_a_plain_object() {
    let script = r#"
        function edit(o) { o.x = 1; delete o.x; o.y = 2; o.x = 3; delete o.a; o.a = 4; o.p = 1; o.q = 2; o.p = 3; return Object.keys(o).join(","); }
        function process(e) {
          const plain = edit({ a: 0, b: 0 });
          const seen = edit(e);
          e.plain = plain;
          e.seen = seen;
          return e;
        }
    "#;
    let mut p = build(json!({ "script": script }));
    let mut e = event(json!({"a": 0, "b": 0}));
    p.process(&mut e).unwrap();
    let out = fields(&e);
    assert_eq!(out["plain"], "b,y,x,a,p,q");
    assert_eq!(out["seen"], "b,y,x,a,p,q");
    let keys: Vec<&String> = e.as_fields().unwrap().keys().collect();
    assert_eq!(keys, ["b", "y", "x", "a", "p", "q", "plain", "seen"]);
}

/// An object kept from an earlier call refuses every use, not only reads.
#[test]
fn a_kept_event_object_refuses_writes_deletes_and_listing() {
    let mut p = build(json!({ "script": r#"
        let kept;
        function process(e) {
          if (kept === undefined) { kept = e; return e; }
          const tries = [() => kept.a, () => { kept.a = 1; }, () => { delete kept.a; },
                         () => "a" in kept, () => Object.keys(kept)];
          return { errors: tries.map((t) => { try { t(); return "none"; } catch (x) { return x.name; } }) };
        }
    "# }));
    p.process(&mut event(json!({"a": 1}))).unwrap();
    let mut e = event(json!({}));
    p.process(&mut e).unwrap();
    assert_eq!(fields(&e)["errors"], json!(vec!["TypeError"; 5]));
}

/// The names a call touches are held outside the JS heap; they are charged
/// against `memory_limit_mb` like the heap (each name its length plus 64
/// bytes, as docs/plugins/js.md says), and the worker goes on.
#[test]
fn touching_endless_names_runs_out_of_memory_not_the_host() {
    let mut p = build(json!({
        "script": "function process(e) { if (e.ok) return e; for (let i = 0; ; i++) { if (e.del) delete e['k' + i]; else e['k' + i] = i; } }",
        "memory_limit_mb": 1,
        "timeout_ms": 20000
    }));
    for hog in [json!({"set": true}), json!({"del": true})] {
        let err = p.process(&mut event(hog)).unwrap_err();
        assert!(err.0.contains("out of memory"), "{err}");
        assert!(matches!(
            p.process(&mut event(json!({"ok": 1}))),
            Ok(Verdict::Keep)
        ));
    }
    // Exactly as many names as the charge allows: 64-byte names cost 128
    // bytes each, and 1 MiB holds 8,192 of them (the last one exactly).
    let mut p = build(json!({
        "script": r#"function process(e) {
            let n = 0;
            try { for (;;) { e["k" + String(n).padStart(63, "0")] = 1; n++; } }
            catch (x) { return { n, why: String(x) }; }
        }"#,
        "memory_limit_mb": 1,
        // Memory is what this measures, not time: the default 50 ms ran
        // out once on a loaded CI machine (8,192 names in a debug build).
        "timeout_ms": 20000,
    }));
    let mut e = event(json!({}));
    p.process(&mut e).unwrap();
    assert_eq!(
        fields(&e)["n"],
        (1 << 20) / (64 + 64),
        "{}",
        fields(&e)["why"]
    );
}
