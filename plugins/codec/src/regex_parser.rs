//! `parser: regex`: a regular expression with named captures; each
//! capture that took part in the match becomes a string field.

#[cfg(feature = "parser-regex")]
mod plugin {
    use logbus_plugin_api::{
        BuildContext, CheckOptions, Event, EventError, Fields, OptionError, Payload, Processor,
        StageKind, TypedPlugin, Verdict,
    };
    use serde::Deserialize;
    use serde_json::Value;

    /// Options of `parser: regex`.
    #[derive(Debug, Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct RegexOptions {
        /// The pattern (Rust `regex` syntax) with at least one named
        /// capture, `(?P<name>...)`. Unanchored unless you anchor it.
        pub pattern: String,
    }

    impl CheckOptions for RegexOptions {
        fn check(&self) -> Vec<OptionError> {
            match regex::Regex::new(&self.pattern) {
                Err(e) => vec![OptionError::at(
                    &["pattern"],
                    format!("not a valid regex: {e}"),
                )],
                Ok(re) if re.capture_names().flatten().next().is_none() => vec![OptionError::at(
                    &["pattern"],
                    "has no named capture; name what you want as fields: (?P<name>...)",
                )],
                Ok(_) => Vec::new(),
            }
        }
    }

    pub struct RegexParser;

    impl TypedPlugin for RegexParser {
        type Options = RegexOptions;
        const NAME: &'static str = "regex";
        const KIND: StageKind = StageKind::Parser;

        type Stage = Box<dyn Processor>;
        const DESCRIPTION: &'static str = "Matches a raw line against a pattern; its named captures become fields. No match is an error.";
        /// Exactly the named captures, each a string (an optional group
        /// that did not take part is absent, which a closed set allows).
        fn flow(&self, o: &RegexOptions) -> logbus_plugin_api::Flow {
            let Ok(re) = regex::Regex::new(&o.pattern) else {
                return logbus_plugin_api::Flow::unknown(StageKind::Parser);
            };
            let mut flow =
                logbus_plugin_api::Flow::fields(&[]).needs(logbus_plugin_api::Needs::Raw);
            for name in re.capture_names().flatten() {
                flow = flow.set(name, logbus_plugin_api::FieldType::String, &["pattern"]);
            }
            flow
        }
        fn build(&self, o: RegexOptions, _cx: &BuildContext) -> Result<Self::Stage, OptionError> {
            let re = regex::Regex::new(&o.pattern)
                .map_err(|e| OptionError::at(&["pattern"], e.to_string()))?;
            let names: Vec<String> = re.capture_names().flatten().map(str::to_string).collect();
            Ok(Box::new(
                move |e: &mut Event| -> Result<Verdict, EventError> {
                    let bytes = crate::raw_input(e, "regex")?;
                    let text = std::str::from_utf8(bytes).map_err(|err| {
                        EventError::new(format!("invalid UTF-8 at byte {}", err.valid_up_to()))
                    })?;
                    let caps = re
                        .captures(text)
                        .ok_or_else(|| EventError::new("the line does not match `pattern`"))?;
                    let mut fields = Fields::new();
                    for name in &names {
                        if let Some(m) = caps.name(name) {
                            fields.insert(name.clone(), Value::String(m.as_str().to_string()));
                        }
                    }
                    *e.payload_mut() = Payload::Fields(fields);
                    Ok(Verdict::Keep)
                },
            ))
        }
    }
}

#[cfg(feature = "parser-regex")]
pub use plugin::{RegexOptions, RegexParser};
