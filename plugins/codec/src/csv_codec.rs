//! Comma-separated values, one record per event: `parser: csv` names the
//! columns (given, or taken from the first record the stage sees) and
//! `formatter: csv` writes the named fields in column order. Quoting and
//! escaping follow RFC 4180 (the `csv` crate). Values are strings; with
//! `types: auto` the parser types bare numbers and booleans like `kv` does.

#![cfg_attr(
    not(any(feature = "parser-csv", feature = "formatter-csv")),
    allow(dead_code, unused_imports)
)]

use logbus_plugin_api::Fields;
use serde_json::Value;

use crate::DecodeError;

/// Splits one record into its values.
#[cfg(any(feature = "parser-csv", feature = "formatter-csv"))]
pub fn split(input: &[u8], delimiter: u8) -> Result<Vec<String>, DecodeError> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .delimiter(delimiter)
        .flexible(true)
        .from_reader(input);
    let mut record = csv::StringRecord::new();
    match reader.read_record(&mut record) {
        Ok(true) => {}
        Ok(false) => return Ok(Vec::new()),
        Err(e) => {
            let offset = e.position().map_or(0, |p| p.byte() as usize);
            return Err(DecodeError::at(offset, format!("bad CSV: {e}")));
        }
    }
    let consumed = reader.position().byte() as usize;
    if consumed < input.len() && input[consumed..].iter().any(|b| !b"\r\n".contains(b)) {
        return Err(DecodeError::at(
            consumed,
            "more than one record in the event",
        ));
    }
    Ok(record.iter().map(str::to_string).collect())
}

/// Names each value by its column. Too many values is an error; too few
/// leaves the missing columns out.
pub fn name(values: Vec<String>, columns: &[String], auto: bool) -> Result<Fields, DecodeError> {
    if values.len() > columns.len() {
        return Err(DecodeError::at(
            0,
            format!("{} values for {} columns", values.len(), columns.len()),
        ));
    }
    Ok(columns
        .iter()
        .zip(values)
        .map(|(c, v)| {
            let value = if auto && !v.is_empty() {
                crate::kv::bare(&v, crate::kv::Types::Auto)
            } else {
                Value::String(v)
            };
            (c.clone(), value)
        })
        .collect())
}

/// Writes the columns' values in order (a missing field is empty).
#[cfg(any(feature = "parser-csv", feature = "formatter-csv"))]
pub fn encode(fields: &Fields, columns: &[String], delimiter: u8, out: &mut Vec<u8>) {
    let mut writer = csv::WriterBuilder::new()
        .delimiter(delimiter)
        .terminator(csv::Terminator::Any(b'\n'))
        .from_writer(Vec::new());
    let values = columns.iter().map(|c| match fields.get(c) {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    });
    let _ = writer.write_record(values);
    let mut bytes = writer.into_inner().unwrap_or_default();
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
    }
    out.extend_from_slice(&bytes);
}

#[cfg(any(feature = "parser-csv", feature = "formatter-csv"))]
mod plugins {
    use logbus_plugin_api::{
        BuildContext, CheckOptions, Event, EventError, LineBuffer, OptionError, Payload, Processor,
        StageKind, TypedPlugin, Verdict,
    };
    use serde::Deserialize;

    use super::{encode, name, split};
    use crate::kv::Types;

    /// Options of `parser: csv` and `formatter: csv`.
    #[derive(Debug, Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct CsvOptions {
        /// Column names, in order. Parser: omit to take them from the first
        /// record this stage (each worker) sees. Formatter: required.
        #[serde(default)]
        pub columns: Option<Vec<String>>,
        /// One character (default `,`).
        #[serde(default = "default_delimiter")]
        pub delimiter: String,
        /// Parser: `string` (default) keeps every value a string; `auto`
        /// types numbers and booleans.
        #[serde(default = "default_types")]
        pub types: Types,
    }

    fn default_delimiter() -> String {
        ",".into()
    }
    fn default_types() -> Types {
        Types::String
    }

    impl CheckOptions for CsvOptions {
        fn check(&self) -> Vec<OptionError> {
            let mut errors = Vec::new();
            if self.delimiter.len() != 1 || self.delimiter == "\"" {
                errors.push(OptionError::at(
                    &["delimiter"],
                    format!(
                        "must be one ASCII character other than `\"`, got {:?}",
                        self.delimiter
                    ),
                ));
            }
            if let Some(columns) = &self.columns {
                if columns.is_empty() {
                    errors.push(OptionError::at(
                        &["columns"],
                        "must name at least one column",
                    ));
                }
                for (i, c) in columns.iter().enumerate() {
                    if columns[..i].contains(c) {
                        errors.push(OptionError::at(
                            &["columns", &i.to_string()],
                            format!("`{c}` appears twice"),
                        ));
                    }
                }
            }
            errors
        }
    }

    pub struct CsvParser;

    struct ParseCsv {
        columns: Option<Vec<String>>,
        delimiter: u8,
        auto: bool,
    }

    impl Processor for ParseCsv {
        fn process(&mut self, e: &mut Event) -> Result<Verdict, EventError> {
            let values = split(crate::raw_input(e, "csv")?, self.delimiter)
                .map_err(|err| EventError::new(format!("not CSV: {err}")))?;
            let Some(columns) = &self.columns else {
                // The header: it names the columns and is not an event.
                self.columns = Some(values);
                return Ok(Verdict::Discard);
            };
            let fields = name(values, columns, self.auto)
                .map_err(|err| EventError::new(format!("not CSV: {err}")))?;
            *e.payload_mut() = Payload::Fields(fields);
            Ok(Verdict::Keep)
        }
    }

    impl TypedPlugin for CsvParser {
        type Options = CsvOptions;
        const NAME: &'static str = "csv";
        const KIND: StageKind = StageKind::Parser;

        type Stage = Box<dyn Processor>;
        const DESCRIPTION: &'static str = "Parses one CSV record per event into fields named by `columns` (or by a header record).";
        /// Given `columns`, exactly those (strings, or any type with
        /// `types: auto`); from a header record, unknown until it is read.
        fn flow(&self, o: &CsvOptions) -> logbus_plugin_api::Flow {
            use logbus_plugin_api::{FieldType, Flow, Needs};
            let Some(columns) = &o.columns else {
                return Flow::open_fields(&[]).needs(Needs::Raw);
            };
            let ty = match o.types {
                Types::Auto => FieldType::Any,
                Types::String => FieldType::String,
            };
            columns
                .iter()
                .enumerate()
                .fold(Flow::fields(&[]).needs(Needs::Raw), |flow, (i, c)| {
                    flow.set(c.clone(), ty, &["columns", &i.to_string()])
                })
        }
        fn build(&self, o: CsvOptions, _cx: &BuildContext) -> Result<Self::Stage, OptionError> {
            Ok(Box::new(ParseCsv {
                columns: o.columns,
                delimiter: o.delimiter.as_bytes()[0],
                auto: o.types == Types::Auto,
            }))
        }
    }

    pub struct CsvFormatter;

    fn no_columns() -> OptionError {
        OptionError::at(&["columns"], "the csv formatter needs `columns`")
    }

    impl TypedPlugin for CsvFormatter {
        type Options = CsvOptions;
        const NAME: &'static str = "csv";
        const KIND: StageKind = StageKind::Formatter;

        type Stage = Box<dyn Processor>;
        const DESCRIPTION: &'static str =
            "Writes the `columns` of each event as one CSV record (RFC 4180 quoting).";
        /// The parser can take its columns from a header line; the
        /// formatter has none to read, and validation must say so.
        fn check_in_context(&self, o: &CsvOptions, _cx: &BuildContext) -> Vec<OptionError> {
            match o.columns {
                Some(_) => Vec::new(),
                None => vec![no_columns()],
            }
        }

        /// Each column is read (a missing one is written empty).
        fn flow(&self, o: &CsvOptions) -> logbus_plugin_api::Flow {
            use logbus_plugin_api::{FieldRead, Flow, Needs, ReadRole};
            let mut flow = Flow::pass().needs(Needs::Fields);
            for (i, c) in o.columns.iter().flatten().enumerate() {
                flow = flow.read(FieldRead::new(
                    c.clone(),
                    &["columns", &i.to_string()],
                    ReadRole::Optional,
                ));
            }
            flow.then(logbus_plugin_api::Step::EmitRaw)
        }
        fn build(&self, o: CsvOptions, _cx: &BuildContext) -> Result<Self::Stage, OptionError> {
            let Some(columns) = o.columns else {
                return Err(no_columns());
            };
            let delimiter = o.delimiter.as_bytes()[0];
            let mut buffer = LineBuffer::new();
            Ok(Box::new(
                move |e: &mut Event| -> Result<Verdict, EventError> {
                    let line = buffer.line(|out| {
                        encode(crate::fields_input(e, "csv")?, &columns, delimiter, out);
                        Ok::<_, EventError>(())
                    })?;
                    *e.payload_mut() = Payload::Raw(line);
                    Ok(Verdict::Keep)
                },
            ))
        }
    }
}

#[cfg(any(feature = "parser-csv", feature = "formatter-csv"))]
pub use plugins::{CsvFormatter, CsvOptions, CsvParser};
