//! `transform: route` splits one stream into named branches without
//! re-testing each event in a filter per branch: the conditions are
//! compiled once, an event is tested against them in order, and it goes to
//! every route it matches (a copy each, sharing its acknowledgement) or
//! only the first (`mode: first`). What matches none goes to `_unmatched`.
//! Each route is an output the engine wires like `<id>.errors`
//! (`Plugin::outputs`), so downstream stages name `<id>.<route>`.

use logbus_condition::Condition;
use logbus_plugin_api::{
    BuildContext, CheckOptions, Event, EventError, Flow, Needs, OptionError, OutputSet, Processor,
    StageKind, TypedPlugin, Verdict,
};
use serde::Deserialize;

use crate::filter::compiled_at;
use crate::{condition_reads, needs_fields};

/// The output of events that matched no route.
pub const UNMATCHED: &str = "_unmatched";

/// Whether an event goes to every route it matches or only the first.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum RouteMode {
    #[default]
    All,
    First,
}

/// Options of `transform: route`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteOptions {
    /// Route name to condition (docs/conditions.md), tested in this order.
    /// Names are letters, digits, `_` and `-`; downstream stages read
    /// `<id>.<name>`, and `<id>._unmatched` for events that matched none.
    #[schemars(with = "std::collections::BTreeMap<String, String>")]
    pub routes: serde_json::Map<String, serde_json::Value>,
    /// `all` (default): an event goes to every route it matches; `first`:
    /// only to the first.
    #[serde(default)]
    pub mode: RouteMode,
}

impl RouteOptions {
    fn name_error(name: &str) -> Option<String> {
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            Some(format!(
                "route name `{name}`: use letters, digits, `_` and `-`"
            ))
        } else if name == UNMATCHED || name == "errors" || name == "dead" {
            Some(format!(
                "route name `{name}` is reserved (`{UNMATCHED}` takes what matches no route; `errors` and `dead` are side outputs)"
            ))
        } else {
            None
        }
    }
}

impl CheckOptions for RouteOptions {
    fn check(&self) -> Vec<OptionError> {
        let mut errors = Vec::new();
        if self.routes.is_empty() {
            errors.push(OptionError::at(
                &["routes"],
                "give at least one route, e.g. `routes: { failures: 'level == \"error\"' }`",
            ));
        }
        if self.routes.len() >= OutputSet::MAX {
            errors.push(OptionError::at(
                &["routes"],
                format!(
                    "{} routes; a route stage takes at most {}",
                    self.routes.len(),
                    OutputSet::MAX - 1
                ),
            ));
        }
        for (name, text) in &self.routes {
            if let Some(e) = Self::name_error(name) {
                errors.push(OptionError::at(&["routes", name], e));
            } else if let Err(e) = condition(name, text) {
                errors.push(e);
            }
        }
        errors
    }
}

/// A route's condition, which must be text.
fn condition(name: &str, text: &serde_json::Value) -> Result<Condition, OptionError> {
    match text {
        serde_json::Value::String(text) => compiled_at(text, &["routes", name]),
        other => Err(OptionError::at(
            &["routes", name],
            format!("a route's condition is text (quote it), got {other}"),
        )),
    }
}

pub struct RouteTransform;

impl TypedPlugin for RouteTransform {
    type Options = RouteOptions;
    const NAME: &'static str = "route";
    const KIND: StageKind = StageKind::Transform;

    type Stage = Box<dyn Processor>;
    const DESCRIPTION: &'static str = "Sends each event to the named routes whose condition it matches (`routes: { failures: 'level == \"error\"' }`, read as `<id>.failures`), or only the first with `mode: first`; what matches none goes to `<id>._unmatched`.";

    fn outputs(&self, options: &RouteOptions) -> Vec<String> {
        options
            .routes
            .keys()
            .cloned()
            .chain([UNMATCHED.to_string()])
            .collect()
    }

    fn flow(&self, options: &RouteOptions) -> Flow {
        let mut flow = Flow::pass().needs(Needs::Fields);
        for (name, text) in &options.routes {
            let Some(condition) = text.as_str().and_then(|t| Condition::compile(t).ok()) else {
                continue;
            };
            for read in condition_reads(&condition, &["routes", name]) {
                flow = flow.read(read);
            }
        }
        flow
    }

    fn build(&self, options: RouteOptions, _cx: &BuildContext) -> Result<Self::Stage, OptionError> {
        let routes = options
            .routes
            .iter()
            .map(|(name, text)| condition(name, text))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Box::new(Route {
            unmatched: routes.len(),
            routes,
            first: options.mode == RouteMode::First,
        }))
    }
}

struct Route {
    routes: Vec<Condition>,
    /// The index of `_unmatched` among the outputs: after the routes.
    unmatched: usize,
    first: bool,
}

impl Route {
    fn outputs(&self, event: &Event) -> Result<OutputSet, EventError> {
        if !event.is_parsed() {
            return Err(needs_fields("route"));
        }
        let mut set = OutputSet::default();
        for (i, condition) in self.routes.iter().enumerate() {
            // Through the event: lazy fields parse only what is named.
            if condition.matches(event) {
                set.insert(i);
                if self.first {
                    break;
                }
            }
        }
        if set.is_empty() {
            set.insert(self.unmatched);
        }
        Ok(set)
    }
}

impl Processor for Route {
    fn process(&mut self, event: &mut Event) -> Result<Verdict, EventError> {
        self.outputs(event).map(Verdict::To)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use logbus_plugin_api::{Plugin, Typed, testing};
    use serde_json::{Value, json};

    /// The stage as the engine builds it.
    fn route(options: Value) -> Box<dyn Processor> {
        let o: RouteOptions = serde_json::from_value(options).unwrap();
        assert!(o.check().is_empty(), "{:?}", o.check());
        let Ok(route) = RouteTransform.build(o, &testing::context()) else {
            panic!("a route stage builds a processor");
        };
        route
    }

    fn meta() -> logbus_plugin_api::Meta {
        logbus_plugin_api::Meta::at("s", 0)
    }

    fn to(r: &mut Box<dyn Processor>, event: Value) -> Vec<usize> {
        let mut e = Event::fields(event.as_object().unwrap().clone(), meta());
        match r.process(&mut e).unwrap() {
            Verdict::To(outputs) => outputs.iter().collect(),
            _ => panic!("a route stage names outputs"),
        }
    }

    #[test]
    fn an_event_goes_to_every_route_it_matches_or_to_unmatched() {
        let routes = json!({
            "failures": r#"level == "error""#,
            "billing": r#"service in ["auth", "billing"] && status >= 500"#,
        });
        let mut all = route(json!({ "routes": routes }));
        let both = json!({"level": "error", "service": "auth", "status": 503});
        assert_eq!(to(&mut all, both.clone()), [0, 1]);
        assert_eq!(to(&mut all, json!({"level": "error"})), [0]);
        assert_eq!(
            to(&mut all, json!({"service": "billing", "status": 500})),
            [1]
        );
        assert_eq!(to(&mut all, json!({"level": "info"})), [2]);
        let mut first = route(json!({ "routes": routes, "mode": "first" }));
        assert_eq!(to(&mut first, both), [0]);
        assert_eq!(to(&mut first, json!({"level": "info"})), [2]);
    }

    #[test]
    fn outputs_are_the_routes_in_order_then_unmatched() {
        let plugin = Typed(RouteTransform);
        let options = json!({"routes": {"b": "x == 1", "a": "x == 2"}});
        assert_eq!(plugin.outputs(&options), ["b", "a", "_unmatched"]);
        assert!(plugin.outputs(&json!({"routes": 7})).is_empty());
    }

    #[test]
    fn bad_routes_say_which_and_why() {
        let check = |v: Value| -> Vec<String> {
            let o: RouteOptions = serde_json::from_value(v).unwrap();
            o.check()
                .into_iter()
                .map(|e| format!("{}: {}", e.path.join("."), e.message))
                .collect()
        };
        assert_eq!(
            check(json!({"routes": {}})),
            ["routes: give at least one route, e.g. `routes: { failures: 'level == \"error\"' }`"]
        );
        assert_eq!(
            check(json!({"routes": {"a.b": "x == 1", "_unmatched": "x == 2"}})),
            [
                "routes.a.b: route name `a.b`: use letters, digits, `_` and `-`",
                "routes._unmatched: route name `_unmatched` is reserved (`_unmatched` takes what matches no route; `errors` and `dead` are side outputs)"
            ]
        );
        for reserved in ["errors", "dead"] {
            let e = check(json!({"routes": {reserved: "x == 1"}}));
            assert_eq!(e.len(), 1, "{e:?}");
            assert!(
                e[0].contains(&format!("route name `{reserved}` is reserved")),
                "{e:?}"
            );
        }
        assert_eq!(
            check(json!({"routes": {"a-b_9": "x == 1"}})),
            Vec::<String>::new()
        );
        assert_eq!(
            check(json!({"routes": {"": "x == 1"}})),
            ["routes.: route name ``: use letters, digits, `_` and `-`"]
        );
        assert_eq!(
            check(json!({"routes": {"n": 5}})),
            ["routes.n: a route's condition is text (quote it), got 5"]
        );
        let e = check(json!({"routes": {"slow": "latency >"}}));
        assert_eq!(e.len(), 1);
        assert!(e[0].starts_with("routes.slow: expected "), "{e:?}");
        assert!(e[0].contains("(at column 10 of the condition)"), "{e:?}");
        let many: serde_json::Map<String, Value> = (0..64)
            .map(|i| (format!("r{i}"), json!("x == 1")))
            .collect();
        assert_eq!(
            check(json!({ "routes": many })),
            ["routes: 64 routes; a route stage takes at most 63"]
        );
    }

    #[test]
    fn an_unparsed_event_is_an_error() {
        let mut r = route(json!({"routes": {"a": "x == 1"}}));
        let mut e = Event::raw(logbus_plugin_api::Bytes::from_static(b"x"), meta());
        assert!(
            r.process(&mut e)
                .err()
                .unwrap()
                .0
                .contains("needs a parsed event")
        );
    }

    /// Each route's condition is read at its own option.
    #[test]
    fn the_flow_reads_each_routes_condition_at_its_option() {
        use logbus_plugin_api::{Needs, Step};
        let o: RouteOptions = serde_json::from_value(serde_json::json!({
            "routes": { "a": "x == 1", "b": "exists(y)", "bad": "((" }
        }))
        .unwrap();
        let flow = RouteTransform.flow(&o);
        assert_eq!(flow.needs, Needs::Fields);
        let reads: Vec<(String, Vec<String>)> = flow
            .steps
            .iter()
            .map(|s| match s {
                Step::Read(r) => (r.field.clone(), r.option.clone()),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            reads,
            [
                ("x".to_string(), vec!["routes".to_string(), "a".to_string()]),
                ("y".to_string(), vec!["routes".to_string(), "b".to_string()]),
            ]
        );
    }
}
