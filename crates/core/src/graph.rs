//! Renders a validated pipeline as Graphviz DOT or as a plain-text tree, for
//! `logbus graph` and for reviewers reading a change to a pipeline.

use std::fmt::Write;

use logbus_plugin_api::StageKind;

use crate::config::Pipeline;

pub fn to_dot(p: &Pipeline) -> String {
    let mut out =
        String::from("digraph logbus {\n  rankdir=LR;\n  node [fontname=\"monospace\"];\n");
    for s in &p.stages {
        let shape = match s.kind {
            StageKind::Source => "invhouse",
            StageKind::Sink => "house",
            _ => "box",
        };
        let _ = writeln!(
            out,
            "  \"{}\" [shape={shape}, label=\"{}\\n{} {}\"];",
            s.id, s.id, s.kind, s.plugin_name
        );
    }
    for s in &p.stages {
        for input in &s.inputs {
            match p.output_of(input) {
                (base, Some(label)) => {
                    // Side outputs dashed; a route's named outputs solid.
                    let named = p
                        .stage(base)
                        .is_some_and(|b| b.outputs.iter().any(|o| o == label));
                    let style = if named { "solid" } else { "dashed" };
                    let _ = writeln!(
                        out,
                        "  \"{base}\" -> \"{}\" [style={style}, label=\"{label}\"];",
                        s.id
                    );
                }
                _ => {
                    let _ = writeln!(out, "  \"{input}\" -> \"{}\";", s.id);
                }
            }
        }
    }
    out.push_str("}\n");
    out
}

/// One line per path from each source, indented by depth; a stage reached
/// twice (fan-in) is printed in full once and referenced after that.
pub fn to_text(p: &Pipeline) -> String {
    let mut out = String::new();
    let mut printed = std::collections::HashSet::new();
    for s in p.stages.iter().filter(|s| s.kind == StageKind::Source) {
        walk(p, &s.id, "", 0, &mut printed, &mut out);
    }
    out
}

fn walk(
    p: &Pipeline,
    id: &str,
    via: &str,
    depth: usize,
    printed: &mut std::collections::HashSet<String>,
    out: &mut String,
) {
    let Some(s) = p.stage(id) else { return };
    let indent = "  ".repeat(depth);
    let arrow = if depth == 0 { "" } else { "└─ " };
    if !printed.insert(id.to_string()) {
        let _ = writeln!(out, "{indent}{arrow}{via}{id} (see above)");
        return;
    }
    let _ = writeln!(
        out,
        "{indent}{arrow}{via}{id} [{} {}]",
        s.kind, s.plugin_name
    );
    let side = s.side_output();
    let via = if s.kind == StageKind::Sink {
        "(dead) "
    } else {
        "(errors) "
    };
    for reader in p.readers_of(id) {
        walk(p, &reader.id, "", depth + 1, printed, out);
    }
    for reader in p.readers_of(&side) {
        walk(p, &reader.id, via, depth + 1, printed, out);
    }
    for name in &s.outputs {
        let via = format!("({name}) ");
        for reader in p.readers_of(&format!("{id}.{name}")) {
            walk(p, &reader.id, &via, depth + 1, printed, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::pipeline;

    const ROUTED: &str = "\
stages:
  in: { source: gen, codec: p, on_error: route }
  r: { transform: t, inputs: [in], routes: [a, b], on_error: route }
  x: { transform: t, inputs: [r.a, in.errors, r.errors] }
  s: { sink: out, inputs: [x, r.b] }
  d: { sink: outer, inputs: [s.dead] }
";

    #[test]
    fn dot_draws_shapes_and_every_edge_by_its_kind() {
        assert_eq!(
            to_dot(&pipeline(ROUTED)),
            r#"digraph logbus {
  rankdir=LR;
  node [fontname="monospace"];
  "in.source" [shape=invhouse, label="in.source\nsource gen"];
  "in" [shape=box, label="in\nparser p"];
  "r" [shape=box, label="r\ntransform t"];
  "x" [shape=box, label="x\ntransform t"];
  "s" [shape=house, label="s\nsink out"];
  "d" [shape=house, label="d\nsink outer"];
  "in.source" -> "in";
  "in" -> "r";
  "r" -> "x" [style=solid, label="a"];
  "in" -> "x" [style=dashed, label="errors"];
  "r" -> "x" [style=dashed, label="errors"];
  "x" -> "s";
  "r" -> "s" [style=solid, label="b"];
  "s" -> "d" [style=dashed, label="dead"];
}
"#
        );
    }

    #[test]
    fn text_is_a_tree_from_each_source_with_fan_in_said_once() {
        assert_eq!(
            to_text(&pipeline(ROUTED)),
            "\
in.source [source gen]
  └─ in [parser p]
    └─ r [transform t]
      └─ (errors) x [transform t]
        └─ s [sink out]
          └─ (dead) d [sink outer]
      └─ (a) x (see above)
      └─ (b) s (see above)
    └─ (errors) x (see above)
"
        );
        let two_sources = "\
stages:
  a: { source: gen }
  b: { source: gen }
  t: { transform: t, inputs: [a, b], on_error: route }
  s: { sink: out, inputs: [t, t.errors] }
";
        assert_eq!(
            to_text(&pipeline(two_sources)),
            "\
a [source gen]
  └─ t [transform t]
    └─ s [sink out]
    └─ (errors) s (see above)
b [source gen]
  └─ t (see above)
"
        );
    }
}
