//! `sink: s3` — events into objects, one open object per key prefix.
//!
//! The object loop (parts, ageing, acknowledgements held until an object
//! exists, retries, dead letters, shutdown) is the sink core's
//! `ObjectDriver`; this module is S3's side of it: the options, the line
//! format, and one request per store call. An object can be far larger
//! than memory: what is held is one part per open object, so memory is at
//! most `max_open_objects` × `part_size_bytes` of compressed bytes, plus
//! the compressors' windows.

use std::io::Write;
use std::time::Duration;

use aws_sdk_s3::Client;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use bytes::Bytes;
use logbus_compress::{CompressWriter, Compression};
use logbus_plugin_api::{
    BuildContext, CheckOptions, Event, OptionError, Payload, Sink, SinkContext, StageError,
    StageKind, TypedPlugin, async_trait,
};
use logbus_sink::{
    Attempt, Journaling, Misfit, ObjectConfig, ObjectDriver, ObjectFormat, ObjectStore,
    ObjectWriter, RetryDefaults, Retrying, Template,
};
use serde::Deserialize;

use crate::client::{AwsOptions, describe, s3_client};

/// S3's smallest part (all but the last).
const MIN_PART: usize = 5 << 20;
/// S3's largest part.
const MAX_PART: usize = 5 << 30;
/// S3's most parts per object.
const MAX_PARTS: usize = 10_000;

/// What an object is.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum ObjectFormatName {
    /// One event after another (`framing`), compressed as a stream.
    #[default]
    Lines,
    /// A Parquet file (options under `parquet`).
    Parquet,
    /// An Avro object container (options under `avro`).
    Avro,
}

/// Options of `sink: s3`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct S3SinkOptions {
    pub bucket: String,
    /// Where objects go: `{{field}}` names and strftime directives (`%Y`,
    /// from the event's ingest time, UTC). Events with the same prefix
    /// share an object; each object is named
    /// `<prefix><unix ms>-<random>.<extension><compression's extension>`.
    #[serde(default = "default_prefix")]
    pub key_prefix: String,
    /// What each object is: `lines` (events in `framing`, compressed),
    /// `parquet` or `avro`.
    #[serde(default)]
    pub object_format: ObjectFormatName,
    /// Parquet objects: page compression, rows per row group, schema.
    #[cfg(feature = "s3-parquet")]
    pub parquet: Option<logbus_parquet::object::ParquetObjectOptions>,
    /// Avro container objects: schema, block codec, records per block.
    #[cfg(feature = "s3-avro")]
    pub avro: Option<logbus_avro::object::AvroObjectOptions>,
    /// The object name's extension, without the compression's (`log`,
    /// `parquet`, `avro` by format).
    pub filename_extension: Option<String>,
    /// How a `lines` object's bytes are compressed as they are written
    /// (`gzip` unless set; Parquet and Avro compress inside, so `none`).
    pub compression: Option<Compression>,
    /// How events follow each other in a `lines` object: raw events as
    /// they are, structured ones as JSON.
    #[serde(default)]
    pub framing: logbus_framing::Framing,
    /// `Content-Type` of the objects (by format if unset).
    pub content_type: Option<String>,
    /// An object is finished once it holds this many bytes: of events
    /// before compression for `lines`, encoded for Parquet and Avro.
    #[serde(default = "default_max_object_bytes")]
    pub max_object_bytes: u64,
    /// An object is finished once it holds this many events.
    pub max_object_events: Option<u64>,
    /// An object is finished this long after its first event.
    #[serde(default = "default_max_object_age_ms")]
    pub max_object_age_ms: u64,
    /// Compressed bytes uploaded as one part (5 MiB to 5 GiB); memory is
    /// about this per open object.
    #[serde(default = "default_part_size")]
    pub part_size_bytes: usize,
    /// Open objects (prefixes being written) at most; one more finishes the
    /// oldest first.
    #[serde(default = "default_max_open_objects")]
    pub max_open_objects: usize,
    /// `STANDARD`, `STANDARD_IA`, `GLACIER_IR`, … (the bucket's default if
    /// unset).
    pub storage_class: Option<String>,
    /// `AES256` or `aws:kms`.
    pub server_side_encryption: Option<String>,
    /// The KMS key for `server_side_encryption: aws:kms`.
    pub ssekms_key_id: Option<String>,
    #[serde(flatten)]
    pub aws: AwsOptions,
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    #[serde(flatten)]
    pub retrying: Retrying<S3SinkDefaults>,
    #[serde(flatten)]
    pub journaling: Journaling,
}

/// `sink: s3`'s own retry defaults.
pub struct S3SinkDefaults;

impl RetryDefaults for S3SinkDefaults {}

fn default_prefix() -> String {
    "%Y/%m/%d/".into()
}
fn default_max_object_bytes() -> u64 {
    100 << 20
}
fn default_max_object_age_ms() -> u64 {
    300_000
}
fn default_part_size() -> usize {
    MIN_PART
}
fn default_max_open_objects() -> usize {
    16
}
fn default_request_timeout_ms() -> u64 {
    60_000
}

impl CheckOptions for S3SinkOptions {
    fn check(&self) -> Vec<OptionError> {
        let mut errors = self.aws.check();
        if self.bucket.is_empty() {
            errors.push(OptionError::at(&["bucket"], "must not be empty"));
        }
        if let Err(e) = Template::parse_timed(&self.key_prefix) {
            errors.push(OptionError::at(&["key_prefix"], e));
        }
        if !(MIN_PART..=MAX_PART).contains(&self.part_size_bytes) {
            errors.push(OptionError::at(
                &["part_size_bytes"],
                format!(
                    "must be between {MIN_PART} (5 MiB) and {MAX_PART} (5 GiB), S3's limits on a part; got {}",
                    self.part_size_bytes
                ),
            ));
        }
        for (key, value) in [
            ("max_object_bytes", self.max_object_bytes),
            ("max_object_age_ms", self.max_object_age_ms),
            ("max_open_objects", self.max_open_objects as u64),
            ("request_timeout_ms", self.request_timeout_ms),
        ] {
            if value == 0 {
                errors.push(OptionError::at(&[key], "must be at least 1"));
            }
        }
        if self.max_object_events == Some(0) {
            errors.push(OptionError::at(
                &["max_object_events"],
                "must be at least 1",
            ));
        }
        errors.extend(self.retrying.check());
        errors.extend(self.journaling.check());
        if self.ssekms_key_id.is_some() && self.server_side_encryption.as_deref() != Some("aws:kms")
        {
            errors.push(OptionError::at(
                &["ssekms_key_id"],
                "needs `server_side_encryption: aws:kms`",
            ));
        }
        if let Some(sse) = &self.server_side_encryption
            && !matches!(sse.as_str(), "AES256" | "aws:kms" | "aws:kms:dsse")
        {
            errors.push(OptionError::at(
                &["server_side_encryption"],
                format!("`{sse}` is not one of AES256, aws:kms, aws:kms:dsse"),
            ));
        }
        match self.object_format {
            ObjectFormatName::Lines => {}
            ObjectFormatName::Parquet | ObjectFormatName::Avro => {
                let name = if self.object_format == ObjectFormatName::Parquet {
                    "Parquet"
                } else {
                    "Avro"
                };
                if self.compression.is_some_and(|c| c != Compression::None) {
                    errors.push(OptionError::at(
                        &["compression"],
                        format!("{name} objects compress inside (their own `compression`/`codec`); leave this unset"),
                    ));
                }
                if self.framing != logbus_framing::Framing::default() {
                    errors.push(OptionError::at(
                        &["framing"],
                        format!("{name} objects have their own framing"),
                    ));
                }
            }
        }
        errors.extend(self.format_check());
        if self.framing == logbus_framing::Framing::Whole {
            errors.push(OptionError::at(
                &["framing"],
                "`whole` cannot hold several events in one object",
            ));
        }
        errors
    }
}

impl S3SinkOptions {
    /// The chosen format's own options, checked; and options given for a
    /// format not chosen (or not built in).
    fn format_check(&self) -> Vec<OptionError> {
        let mut errors = Vec::new();
        #[cfg(feature = "s3-parquet")]
        match (&self.parquet, self.object_format) {
            (Some(p), ObjectFormatName::Parquet) => errors.extend(p.check("parquet")),
            (Some(_), _) => errors.push(OptionError::at(
                &["parquet"],
                "needs `object_format: parquet`",
            )),
            _ => {}
        }
        #[cfg(feature = "s3-avro")]
        match (&self.avro, self.object_format) {
            (Some(a), ObjectFormatName::Avro) => errors.extend(a.check("avro")),
            (Some(_), _) => errors.push(OptionError::at(&["avro"], "needs `object_format: avro`")),
            (None, ObjectFormatName::Avro) => errors.push(OptionError::at(
                &["avro"],
                "`object_format: avro` needs `avro: { schema: … }`",
            )),
            _ => {}
        }
        #[cfg(not(feature = "s3-parquet"))]
        if self.object_format == ObjectFormatName::Parquet {
            errors.push(OptionError::at(
                &["object_format"],
                "this build has no Parquet objects (cargo feature `s3-parquet`)",
            ));
        }
        #[cfg(not(feature = "s3-avro"))]
        if self.object_format == ObjectFormatName::Avro {
            errors.push(OptionError::at(
                &["object_format"],
                "this build has no Avro objects (cargo feature `s3-avro`)",
            ));
        }
        errors
    }

    fn compression(&self) -> Compression {
        match self.object_format {
            ObjectFormatName::Lines => self.compression.unwrap_or(Compression::Gzip),
            _ => Compression::None,
        }
    }

    fn extension(&self) -> &str {
        match (&self.filename_extension, self.object_format) {
            (Some(e), _) => e,
            (None, ObjectFormatName::Lines) => "log",
            (None, ObjectFormatName::Parquet) => "parquet",
            (None, ObjectFormatName::Avro) => "avro",
        }
    }

    fn content_type(&self) -> &str {
        match (&self.content_type, self.object_format) {
            (Some(t), _) => t,
            (None, ObjectFormatName::Lines) => "text/plain",
            (None, ObjectFormatName::Parquet) => "application/vnd.apache.parquet",
            (None, ObjectFormatName::Avro) => "application/avro",
        }
    }

    /// The object format the options describe.
    fn make_format(&self) -> Result<Box<dyn ObjectFormat>, OptionError> {
        Ok(match self.object_format {
            ObjectFormatName::Lines => Box::new(Lines {
                framing: self.framing,
                compression: self.compression(),
            }),
            #[cfg(feature = "s3-parquet")]
            ObjectFormatName::Parquet => Box::new(logbus_parquet::object::ParquetObjects::new(
                &self.parquet.clone().unwrap_or_default(),
                "parquet",
            )?),
            #[cfg(feature = "s3-avro")]
            ObjectFormatName::Avro => {
                let options = self.avro.as_ref().ok_or_else(|| {
                    OptionError::at(
                        &["avro"],
                        "`object_format: avro` needs `avro: { schema: … }`",
                    )
                })?;
                Box::new(logbus_avro::object::AvroObjects::new(options, "avro")?)
            }
            #[allow(unreachable_patterns)]
            other => {
                return Err(OptionError::at(
                    &["object_format"],
                    format!("`{other:?}` objects are not in this build"),
                ));
            }
        })
    }
}

/// `lines` objects: each event in `framing`, through a streaming
/// compressor.
struct Lines {
    framing: logbus_framing::Framing,
    compression: Compression,
}

impl ObjectFormat for Lines {
    fn open(&self) -> Result<Box<dyn ObjectWriter>, String> {
        Ok(Box::new(LinesObject {
            framing: self.framing,
            body: CompressWriter::new(Vec::new(), self.compression)
                .map_err(|e| format!("starting compression: {e}"))?,
            bytes: 0,
            scratch: Vec::new(),
        }))
    }
}

struct LinesObject {
    framing: logbus_framing::Framing,
    body: CompressWriter<Vec<u8>>,
    bytes: u64,
    scratch: Vec<u8>,
}

impl ObjectWriter for LinesObject {
    fn write(&mut self, event: &Event) -> Result<(), Misfit> {
        self.scratch.clear();
        encode(event, self.framing, &mut self.scratch);
        self.body
            .write_all(&self.scratch)
            .map_err(|e| Misfit::Never(format!("compressing: {e}")))?;
        self.bytes += self.scratch.len() as u64;
        Ok(())
    }

    fn ready(&mut self) -> &mut Vec<u8> {
        self.body.get_mut()
    }

    fn size(&self) -> u64 {
        self.bytes
    }

    fn finish(self: Box<Self>) -> Result<Vec<u8>, String> {
        self.body
            .finish()
            .map_err(|e| format!("finishing the compressed stream: {e}"))
    }
}

pub struct S3Sink;

impl TypedPlugin for S3Sink {
    type Options = S3SinkOptions;
    const NAME: &'static str = "s3";
    const KIND: StageKind = StageKind::Sink;

    type Stage = Box<dyn Sink>;
    const DESCRIPTION: &'static str = "Amazon S3 (or any S3-compatible store): events into objects per key prefix, compressed as written and uploaded in parts, so an object is never whole in memory; its events are confirmed once the object is complete.";

    /// The bucket listed (one key) with the stage's credentials.
    fn connect(
        &self,
        o: &Self::Options,
        _cx: logbus_plugin_api::ConnectContext,
    ) -> Option<logbus_plugin_api::Probe> {
        let (aws, bucket) = (o.aws.clone(), o.bucket.clone());
        Some(Box::pin(async move {
            let client = s3_client(&aws).await;
            match client
                .list_objects_v2()
                .bucket(&bucket)
                .max_keys(1)
                .send()
                .await
            {
                Ok(_) => Vec::new(),
                Err(e) => vec![crate::client::probe_finding(
                    &e,
                    &format!("S3 bucket `{bucket}`"),
                    &["NoSuchBucket"],
                    &["bucket"],
                    true,
                )],
            }
        }))
    }

    /// The journal's directory.
    fn host_needs(
        &self,
        o: &Self::Options,
        cx: &BuildContext,
    ) -> Vec<logbus_plugin_api::StatedNeed> {
        o.journaling.host_need(cx).into_iter().collect()
    }

    /// The key prefix template's fields; with a batch journal, an object
    /// made again after a crash takes its key back (named by position).
    fn flow(&self, o: &Self::Options) -> logbus_plugin_api::Flow {
        let flow = logbus_plugin_api::flow::template_reads(&o.key_prefix, &["key_prefix"])
            .into_iter()
            .fold(
                logbus_plugin_api::Flow::pass(),
                logbus_plugin_api::Flow::read,
            );
        if o.journaling.batch_journal_dir.is_some() {
            flow.then(logbus_plugin_api::Step::NamesByPosition {
                option: vec!["batch_journal_dir".into()],
            })
        } else {
            flow
        }
    }

    fn build(&self, options: Self::Options, cx: &BuildContext) -> Result<Self::Stage, OptionError> {
        let prefix = Template::parse_timed(&options.key_prefix)
            .map_err(|e| OptionError::at(&["key_prefix"], e))?;
        let format = options.make_format()?;
        Ok(Box::new(S3Writer {
            prefix,
            journal_dir: options.journaling.dir(cx),
            options,
            format,
        }))
    }
}

struct S3Writer {
    prefix: Template,
    journal_dir: Option<std::path::PathBuf>,
    options: S3SinkOptions,
    format: Box<dyn ObjectFormat>,
}

/// A bucket, as the object driver sees it: one request per call.
struct Bucket {
    client: Client,
    options: S3SinkOptions,
}

/// One S3 answer as an attempt: throttling and S3's own transient codes
/// are tried again, other refusals are final.
fn attempt<T, E>(r: Result<T, SdkError<E>>) -> Attempt<T>
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match r {
        Ok(v) => Attempt::Done(v),
        Err(e) => match describe(&e, &["SlowDown", "RequestTimeout", "InternalError"]) {
            (message, true) => Attempt::again(message),
            (message, false) => Attempt::Fail(message),
        },
    }
}

#[async_trait]
impl ObjectStore for Bucket {
    type Upload = String;
    type Part = CompletedPart;
    const MAX_PARTS: usize = MAX_PARTS;

    fn key(&self, prefix: &str) -> String {
        object_key(prefix, &self.options)
    }

    async fn put(&self, key: &str, body: &Bytes) -> Attempt<()> {
        let o = &self.options;
        let mut r = self
            .client
            .put_object()
            .bucket(&o.bucket)
            .key(key)
            .content_type(o.content_type())
            .body(ByteStream::from(body.clone()));
        if let Some(encoding) = content_encoding(o.compression()) {
            r = r.content_encoding(encoding);
        }
        if let Some(class) = &o.storage_class {
            r = r.storage_class(class.as_str().into());
        }
        if let Some(sse) = &o.server_side_encryption {
            r = r.server_side_encryption(sse.as_str().into());
        }
        if let Some(kms) = &o.ssekms_key_id {
            r = r.ssekms_key_id(kms);
        }
        attempt(r.send().await).map(|_| ())
    }

    async fn start(&self, key: &str) -> Attempt<String> {
        let o = &self.options;
        let mut r = self
            .client
            .create_multipart_upload()
            .bucket(&o.bucket)
            .key(key)
            .content_type(o.content_type());
        if let Some(encoding) = content_encoding(o.compression()) {
            r = r.content_encoding(encoding);
        }
        if let Some(class) = &o.storage_class {
            r = r.storage_class(class.as_str().into());
        }
        if let Some(sse) = &o.server_side_encryption {
            r = r.server_side_encryption(sse.as_str().into());
        }
        if let Some(kms) = &o.ssekms_key_id {
            r = r.ssekms_key_id(kms);
        }
        attempt(r.send().await).and_then(|out| match out.upload_id() {
            Some(id) => Attempt::Done(id.to_string()),
            None => Attempt::Fail("the service answered no upload id".into()),
        })
    }

    async fn put_part(
        &self,
        key: &str,
        upload: &String,
        number: usize,
        body: &Bytes,
    ) -> Attempt<CompletedPart> {
        let Ok(number) = i32::try_from(number) else {
            return Attempt::Fail(format!("part number {number} is beyond S3's"));
        };
        let r = self
            .client
            .upload_part()
            .bucket(&self.options.bucket)
            .key(key)
            .upload_id(upload)
            .part_number(number)
            .body(ByteStream::from(body.clone()))
            .send()
            .await;
        attempt(r).map(|out| {
            CompletedPart::builder()
                .part_number(number)
                .set_e_tag(out.e_tag().map(str::to_string))
                .build()
        })
    }

    async fn complete(&self, key: &str, upload: &String, parts: &[CompletedPart]) -> Attempt<()> {
        let parts = CompletedMultipartUpload::builder()
            .set_parts(Some(parts.to_vec()))
            .build();
        let r = self
            .client
            .complete_multipart_upload()
            .bucket(&self.options.bucket)
            .key(key)
            .upload_id(upload)
            .multipart_upload(parts)
            .send()
            .await;
        attempt(r).map(|_| ())
    }

    async fn abort(&self, key: &str, upload: &String) -> Result<(), String> {
        self.client
            .abort_multipart_upload()
            .bucket(&self.options.bucket)
            .key(key)
            .upload_id(upload)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| format!("upload id {upload}: {}", describe(&e, &[]).0))
    }
}

fn content_encoding(c: Compression) -> Option<&'static str> {
    match c {
        Compression::Gzip => Some("gzip"),
        Compression::Zstd => Some("zstd"),
        Compression::Deflate => Some("deflate"),
        _ => None,
    }
}

/// Appends one event to `out` in `framing`: raw payloads as they are,
/// structured ones as JSON.
fn encode(event: &Event, framing: logbus_framing::Framing, out: &mut Vec<u8>) {
    match event.payload() {
        Payload::Raw(bytes) => logbus_framing::encode(framing, bytes, out),
        Payload::Fields(fields) => {
            let json = serde_json::to_vec(fields).expect("JSON into a Vec");
            logbus_framing::encode(framing, &json, out);
        }
        Payload::Lazy(fields) => {
            let mut json = Vec::new();
            fields.write_json(&mut json);
            logbus_framing::encode(framing, &json, out);
        }
    }
}

fn object_key(prefix: &str, options: &S3SinkOptions) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    format!(
        "{prefix}{now}-{:016x}.{}{}",
        fastrand::u64(..),
        options.extension(),
        options.compression().extension()
    )
}

#[async_trait]
impl Sink for S3Writer {
    async fn run(self: Box<Self>, cx: &mut SinkContext) -> Result<(), StageError> {
        let S3Writer {
            prefix,
            journal_dir,
            options: o,
            format,
        } = *self;
        let config = ObjectConfig {
            max_object_bytes: o.max_object_bytes,
            max_object_age: Duration::from_millis(o.max_object_age_ms),
            max_object_events: o.max_object_events,
            part_size_bytes: o.part_size_bytes,
            max_open_objects: o.max_open_objects,
            retry: o.retrying.policy(),
            request_timeout: Duration::from_millis(o.request_timeout_ms),
            destination: format!("s3://{}", o.bucket),
        };
        let bucket = Bucket {
            client: s3_client(&o.aws).await,
            options: o,
        };
        ObjectDriver::new(bucket, format, move |e| prefix.render(e), config)
            .journal_in(journal_dir)
            .run(cx)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With a batch journal: `validate --preflight` learns of its
    /// directory, and the flow says objects are named by position.
    #[test]
    fn a_batch_journal_is_a_directory_to_write_and_names_objects_by_position() {
        let plugin = logbus_plugin_api::Typed(S3Sink);
        let with = serde_json::json!({ "bucket": "b", "batch_journal_dir": "journal" });
        assert_eq!(
            logbus_plugin_api::testing::host_needs(&plugin, with.clone()),
            ["batch_journal_dir: WriteDir ./journal create=true"]
        );
        let without = serde_json::json!({ "bucket": "b" });
        assert!(logbus_plugin_api::testing::host_needs(&plugin, without.clone()).is_empty());
        let flow = |o: serde_json::Value| {
            let o: S3SinkOptions = serde_json::from_value(o).unwrap();
            format!("{:?}", S3Sink.flow(&o))
        };
        assert!(flow(with).contains("NamesByPosition"));
        assert!(!flow(without).contains("NamesByPosition"));
    }
}
