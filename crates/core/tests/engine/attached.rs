//! A source's `codec:` and a sink's `format:`: a parser or formatter run
//! as its own stage, named after the stage that carries it.

use logbus_core::start;
use logbus_plugin_api::CancellationToken;

use crate::support::{TestPlugins, load, valid};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_codec_parses_and_a_sink_format_formats() {
    let plugins = TestPlugins::default();
    let text = r#"stages:
  read:
    source: generator
    count: 100
    template: 'level=info seq={{seq}} msg="hello world"'
    codec: { kv: { types: auto } }
    on_error: route
  out: { sink: collect, inputs: [read], format: { csv: { columns: [seq, level, msg] } } }
  bad: { sink: collect, inputs: [read.errors] }
"#;
    let p = valid(text, &plugins.registry());
    let ids: Vec<&str> = p.stages.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["read.source", "read", "out.format", "out", "bad"]);
    let report = start(&p, CancellationToken::new()).unwrap().wait().await;
    assert!(report.is_clean(), "{report}");
    let out = plugins.events("out");
    assert_eq!(out.len(), 100);
    assert_eq!(&out[7].as_raw().unwrap()[..], b"7,info,hello world");
    assert!(plugins.events("bad").is_empty());
}

#[test]
fn codec_and_format_errors_point_at_the_key() {
    let text = "stages:
  read: { source: stdin, codec: jsn }
  out: { sink: stdout, inputs: [read], format: { csv: { delimiter: ';;' } } }
  other: { sink: stdout, inputs: [read], format: [1] }
  p: { parser: json, inputs: [read], codec: json }
  s: { source: generator, on_error: route }
  t: { sink: blackhole, inputs: [s] }
";
    let d = load(text).diagnostics;
    let find = |stage: &str, needle: &str| {
        d.iter()
            .find(|x| x.stage.as_deref() == Some(stage) && x.message.contains(needle))
            .unwrap_or_else(|| panic!("no `{needle}` for {stage} in {d:#?}"))
            .clone()
    };
    let e = find("read", "unknown parser plugin `jsn`; did you mean `json`?");
    assert_eq!(e.line, Some(2));
    let e = find("out", "`format: csv`: option `delimiter`");
    assert_eq!(e.line, Some(3));
    find("other", "`format` must name a formatter plugin");
    find("p", "unknown option `codec`");
    find("s", "`on_error` applies to parsers");
}
