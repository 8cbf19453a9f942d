//! `sink: s3` — events into objects, one open object per key prefix.
//!
//! An object can be far larger than memory: its bytes are compressed as
//! they come and uploaded in parts (S3's multipart upload) whenever
//! `part_size_bytes` of them are ready, so what is held is one part per
//! open object, never the object. The events' data is let go once encoded
//! (their channel slots return), but their acknowledgement handles are
//! kept, one per source batch, until the object is complete: only then are
//! they settled delivered, so a checkpointing source never moves past an
//! event whose object does not exist yet. An object that cannot be
//! finished (the bucket refuses us, retries run out, the drain deadline
//! passes) has its multipart upload aborted, its events settled errored
//! (the source reads them again after a restart), and the stage ends with
//! the reason.
//!
//! Memory: at most `max_open_objects` × `part_size_bytes` of compressed
//! bytes, plus the compressors' windows.

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

use aws_sdk_s3::Client;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use logbus_compress::{CompressWriter, Compression};
use logbus_plugin_api::{
    Ack, BuildContext, CheckOptions, Event, OptionError, Outcome, Payload, Sink, SinkContext,
    StageError, StageKind, TypedPlugin, async_trait, attach_error,
};
use logbus_sink::{
    Attempt, Misfit, ObjectFormat, ObjectWriter, Retried, RetryDefaults, RetryPolicy, Retrying,
    Template,
};
use serde::Deserialize;

use crate::client::{AwsOptions, describe, s3_client};

/// S3's smallest part (all but the last).
const MIN_PART: usize = 5 << 20;
/// S3's largest part.
const MAX_PART: usize = 5 << 30;
/// S3's most parts per object.
const MAX_PARTS: i32 = 10_000;

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

    /// The key prefix template's fields.
    fn flow(&self, o: &Self::Options) -> logbus_plugin_api::Flow {
        logbus_plugin_api::flow::template_reads(&o.key_prefix, &["key_prefix"])
            .into_iter()
            .fold(
                logbus_plugin_api::Flow::pass(),
                logbus_plugin_api::Flow::read,
            )
    }

    fn build(
        &self,
        options: Self::Options,
        _cx: &BuildContext,
    ) -> Result<Self::Stage, OptionError> {
        let prefix = Template::parse_timed(&options.key_prefix)
            .map_err(|e| OptionError::at(&["key_prefix"], e))?;
        let format = options.make_format()?;
        Ok(Box::new(S3Writer {
            prefix,
            options,
            format,
        }))
    }
}

struct S3Writer {
    prefix: Template,
    options: S3SinkOptions,
    format: Box<dyn ObjectFormat>,
}

/// Why an object could not be written: the service refused for good,
/// retries ran out, or the drain deadline passed.
#[derive(Debug)]
struct Failed {
    message: String,
}

/// An object being written.
struct OpenObject {
    key: String,
    opened: Instant,
    events: u64,
    /// The object's encoder; its ready bytes are not yet uploaded.
    body: Box<dyn ObjectWriter>,
    upload_id: Option<String>,
    parts: Vec<CompletedPart>,
    acks: HeldAcks,
}

/// One handle per source batch of an object's events, settled when the
/// object is complete.
#[derive(Default)]
struct HeldAcks(Vec<Ack>);

impl HeldAcks {
    fn hold(&mut self, mut ack: Ack) {
        if !ack.is_pending() {
            return;
        }
        if self.0.last().is_some_and(|last| last.same_batch(&ack)) {
            // The held handle keeps the batch open; the worst outcome wins.
            ack.settle(Outcome::Delivered);
        } else {
            self.0.push(ack);
        }
    }

    fn settle(&mut self, outcome: Outcome) {
        for mut ack in self.0.drain(..) {
            ack.settle(outcome);
        }
    }
}

/// What the sink's requests need of its context (the input stays the
/// loop's to read).
struct Stage {
    id: std::sync::Arc<str>,
    metrics: std::sync::Arc<logbus_plugin_api::StageMetrics>,
    stop: logbus_plugin_api::CancellationToken,
}

struct Uploader<'a> {
    client: Client,
    options: &'a S3SinkOptions,
    retry: RetryPolicy,
    cx: Stage,
}

impl Uploader<'_> {
    /// Runs `attempt` under the retry policy; `Err` once it is refused for
    /// good, retries run out or the drain deadline passes.
    async fn retrying<T, E, F, Fut>(&self, what: &str, mut attempt: F) -> Result<T, Failed>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, SdkError<E>>>,
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let timeout = Duration::from_millis(self.options.request_timeout_ms);
        let stop = &self.cx.stop;
        let retried = self
            .retry
            .run(
                stop,
                |_| {
                    let sent = attempt();
                    async move {
                        let outcome = tokio::select! {
                            r = tokio::time::timeout(timeout, sent) => r,
                            () = stop.cancelled() => {
                                return Attempt::Fail("stopped at the drain deadline while retrying".into());
                            }
                        };
                        match outcome {
                            Ok(Ok(v)) => Attempt::Done(v),
                            Ok(Err(e)) => {
                                match describe(&e, &["SlowDown", "RequestTimeout", "InternalError"]) {
                                    (message, true) => Attempt::again(message),
                                    (message, false) => Attempt::Fail(message),
                                }
                            }
                            Err(_) => Attempt::again(format!("no answer within {timeout:?}")),
                        }
                    }
                },
                |message, delay| {
                    tracing::warn!(stage = %self.cx.id, "{what}: {message}; retrying in {delay:?}");
                    self.cx.metrics.add_retried(1);
                },
            )
            .await;
        let message = match retried {
            Retried::Done(v) => return Ok(v),
            Retried::Failed(message) => format!("{what}: {message}"),
            Retried::GaveUp { reason, attempts } => {
                format!("{what}: {reason} (gave up after {attempts} attempts)")
            }
            Retried::Stopped(reason) => {
                format!("{what}: {reason} (stopped at the drain deadline while retrying)")
            }
        };
        Err(Failed { message })
    }

    async fn start_upload(&self, key: &str) -> Result<String, Failed> {
        let o = self.options;
        let out = self
            .retrying(
                &format!("starting the upload of s3://{}/{key}", o.bucket),
                || {
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
                    r.send()
                },
            )
            .await?;
        out.upload_id().map(str::to_string).ok_or_else(|| Failed {
            message: format!("s3://{}/{key}: the service answered no upload id", o.bucket),
        })
    }

    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        number: i32,
        body: Vec<u8>,
    ) -> Result<CompletedPart, Failed> {
        let o = self.options;
        let body = aws_sdk_s3::primitives::SdkBody::from(body);
        let out = self
            .retrying(
                &format!("uploading part {number} of s3://{}/{key}", o.bucket),
                || {
                    self.client
                        .upload_part()
                        .bucket(&o.bucket)
                        .key(key)
                        .upload_id(upload_id)
                        .part_number(number)
                        .body(ByteStream::new(
                            body.try_clone().expect("an in-memory body"),
                        ))
                        .send()
                },
            )
            .await?;
        Ok(CompletedPart::builder()
            .part_number(number)
            .set_e_tag(out.e_tag().map(str::to_string))
            .build())
    }

    async fn put(&self, key: &str, body: Vec<u8>) -> Result<(), Failed> {
        let o = self.options;
        let body = aws_sdk_s3::primitives::SdkBody::from(body);
        self.retrying(&format!("writing s3://{}/{key}", o.bucket), || {
            let mut r = self
                .client
                .put_object()
                .bucket(&o.bucket)
                .key(key)
                .content_type(o.content_type())
                .body(ByteStream::new(
                    body.try_clone().expect("an in-memory body"),
                ));
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
            r.send()
        })
        .await
        .map(|_| ())
    }

    async fn complete(
        &self,
        key: &str,
        upload_id: &str,
        parts: Vec<CompletedPart>,
    ) -> Result<(), Failed> {
        let o = self.options;
        let parts = CompletedMultipartUpload::builder()
            .set_parts(Some(parts))
            .build();
        self.retrying(&format!("completing s3://{}/{key}", o.bucket), || {
            self.client
                .complete_multipart_upload()
                .bucket(&o.bucket)
                .key(key)
                .upload_id(upload_id)
                .multipart_upload(parts.clone())
                .send()
        })
        .await
        .map(|_| ())
    }

    /// Best effort: an upload left behind costs storage until the bucket's
    /// lifecycle rule (if any) removes it.
    async fn abort(&self, key: &str, upload_id: &str) {
        let o = self.options;
        let r = tokio::time::timeout(
            Duration::from_millis(o.request_timeout_ms),
            self.client
                .abort_multipart_upload()
                .bucket(&o.bucket)
                .key(key)
                .upload_id(upload_id)
                .send(),
        )
        .await;
        if !matches!(r, Ok(Ok(_))) {
            tracing::warn!(stage = %self.cx.id, "could not abort the unfinished upload of s3://{}/{key} (id {upload_id}); a lifecycle rule for incomplete multipart uploads removes it", o.bucket);
        }
    }

    /// The number of the object's next part, if S3 takes one more.
    fn next_part(&self, key: &str, parts: &[CompletedPart]) -> Result<i32, Failed> {
        next_part_number(parts.len()).ok_or_else(|| Failed {
            message: format!(
                "s3://{}/{key}: more than {MAX_PARTS} parts (raise part_size_bytes or lower max_object_bytes)",
                self.options.bucket
            ),
        })
    }

    /// Uploads the bytes compressed so far as the object's next part.
    async fn flush_part(&self, object: &mut OpenObject) -> Result<(), Failed> {
        let upload_id = match &object.upload_id {
            Some(id) => id.clone(),
            None => {
                let id = self.start_upload(&object.key).await?;
                object.upload_id = Some(id.clone());
                id
            }
        };
        let number = self.next_part(&object.key, &object.parts)?;
        let body = std::mem::take(object.body.ready());
        let part = self
            .upload_part(&object.key, &upload_id, number, body)
            .await?;
        object.parts.push(part);
        Ok(())
    }

    /// Finishes the object: the last part and the completion (or one
    /// PUT for an object that never needed parts), then its events are
    /// delivered.
    async fn finish(&self, mut object: OpenObject) -> Result<u64, Failed> {
        if object.events == 0 && object.upload_id.is_none() {
            // Every event was refused: no object.
            return Ok(0);
        }
        let body = object.body;
        let result = match body.finish() {
            Err(e) => Err(Failed {
                message: format!("encoding s3://{}/{}: {e}", self.options.bucket, object.key),
            }),
            Ok(body) => {
                self.store(
                    &object.key,
                    object.upload_id.as_deref(),
                    &mut object.parts,
                    body,
                )
                .await
            }
        };
        match result {
            Ok(()) => {
                object.acks.settle(Outcome::Delivered);
                tracing::debug!(stage = %self.cx.id, key = %object.key, events = object.events, "object written");
                Ok(object.events)
            }
            Err(e) => {
                object.acks.settle(Outcome::Errored);
                self.cx.metrics.add_errored(object.events);
                Err(e)
            }
        }
    }

    /// Stores the object's last bytes: one PUT, or the last part and the
    /// completion (the upload aborted if either fails).
    async fn store(
        &self,
        key: &str,
        upload_id: Option<&str>,
        parts: &mut Vec<CompletedPart>,
        body: Vec<u8>,
    ) -> Result<(), Failed> {
        let Some(upload_id) = upload_id else {
            return self.put(key, body).await;
        };
        let stored = async {
            let number = self.next_part(key, parts)?;
            let part = self.upload_part(key, upload_id, number, body).await?;
            let mut parts = std::mem::take(parts);
            parts.push(part);
            self.complete(key, upload_id, parts).await
        }
        .await;
        if stored.is_err() {
            self.abort(key, upload_id).await;
        }
        stored
    }

    /// Gives an object up: its upload aborted, its events errored.
    async fn give_up(&self, mut object: OpenObject) -> u64 {
        if let Some(id) = object.upload_id.clone() {
            self.abort(&object.key, &id).await;
        }
        object.acks.settle(Outcome::Errored);
        self.cx.metrics.add_errored(object.events);
        object.events
    }
}

/// The number of the part after `done` parts, if S3 takes one more: parts
/// are numbered from 1 to 10,000.
fn next_part_number(done: usize) -> Option<i32> {
    i32::try_from(done + 1).ok().filter(|n| *n <= MAX_PARTS)
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
        let o = &self.options;
        let up = Uploader {
            client: s3_client(&o.aws).await,
            options: o,
            retry: o.retrying.policy(),
            cx: Stage {
                id: cx.id.clone(),
                metrics: cx.metrics.clone(),
                stop: cx.stop.clone(),
            },
        };
        let max_age = Duration::from_millis(o.max_object_age_ms);
        let mut open: HashMap<String, OpenObject> = HashMap::new();
        let mut warned_refused = false;
        // Once a shutdown is requested, every object is finished as soon as
        // no more input is ready (the sources wait for these events'
        // acknowledgements before they end).
        let mut draining = false;
        let failure = 'run: loop {
            let ready = if draining && !open.is_empty() {
                match cx.input.try_recv() {
                    Some(batch) => Some(batch),
                    None => {
                        let mut objects = open.drain().collect::<Vec<_>>().into_iter();
                        while let Some((_, object)) = objects.next() {
                            match up.finish(object).await {
                                Ok(n) => cx.committed(n as usize),
                                Err(e) => {
                                    // The rest are given up below.
                                    open.extend(objects);
                                    break 'run Some(e);
                                }
                            }
                        }
                        continue;
                    }
                }
            } else {
                None
            };
            // The next object to age out bounds the wait for input.
            let next_due = open.values().map(|x| x.opened + max_age).min();
            let batch = if ready.is_some() {
                ready
            } else {
                tokio::select! {
                b = cx.input.recv() => b,
                () = cx.shutdown.cancelled(), if !draining => {
                    draining = true;
                    continue;
                }
                () = async {
                    match next_due {
                        Some(at) => tokio::time::sleep_until(at.into()).await,
                        None => std::future::pending().await,
                    }
                } => {
                    let due: Vec<String> = open
                        .iter()
                        .filter(|(_, x)| x.opened.elapsed() >= max_age)
                        .map(|(k, _)| k.clone())
                        .collect();
                    for prefix in due {
                        let object = open.remove(&prefix).expect("listed");
                        match up.finish(object).await {
                            Ok(n) => cx.committed(n as usize),
                            Err(e) => break 'run Some(e),
                        }
                    }
                    continue;
                }
                }
            };
            let Some(mut batch) = batch else { break None };
            cx.metrics.add_in(batch.len() as u64);
            let mut refused = Vec::new();
            for mut event in batch.take() {
                let prefix = self.prefix.render(&event);
                // At most twice: an event that does not fit its prefix's
                // open object (a Parquet schema) finishes it and starts the
                // next.
                let mut tries = 0;
                loop {
                    tries += 1;
                    if !open.contains_key(&prefix) && open.len() >= o.max_open_objects {
                        let oldest = open
                            .iter()
                            .min_by_key(|(_, x)| x.opened)
                            .map(|(k, _)| k.clone())
                            .expect("not empty");
                        let object = open.remove(&oldest).expect("listed");
                        match up.finish(object).await {
                            Ok(n) => cx.committed(n as usize),
                            Err(e) => {
                                event.settle(Outcome::Errored);
                                break 'run Some(e);
                            }
                        }
                    }
                    let object = match open.entry(prefix.clone()) {
                        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                        std::collections::hash_map::Entry::Vacant(e) => {
                            let key = object_key(e.key(), o);
                            let body = self.format.open().map_err(StageError::Other)?;
                            e.insert(OpenObject {
                                key,
                                opened: Instant::now(),
                                events: 0,
                                body,
                                upload_id: None,
                                parts: Vec::new(),
                                acks: HeldAcks::default(),
                            })
                        }
                    };
                    match object.body.write(&event) {
                        Ok(()) => {}
                        Err(Misfit::NextObject(_)) if tries == 1 && object.events > 0 => {
                            let object = open.remove(&prefix).expect("just written");
                            match up.finish(object).await {
                                Ok(n) => cx.committed(n as usize),
                                Err(e) => {
                                    event.settle(Outcome::Errored);
                                    break 'run Some(e);
                                }
                            }
                            continue;
                        }
                        Err(Misfit::NextObject(why) | Misfit::Never(why)) => {
                            refused.push((event, why));
                            break;
                        }
                    }
                    object.events += 1;
                    object.acks.hold(event.take_ack());
                    let full = object.body.size() >= o.max_object_bytes
                        || o.max_object_events.is_some_and(|m| object.events >= m);
                    if full {
                        let object = open.remove(&prefix).expect("just written");
                        match up.finish(object).await {
                            Ok(n) => cx.committed(n as usize),
                            Err(e) => break 'run Some(e),
                        }
                    } else if object.body.ready().len() >= o.part_size_bytes
                        && let Err(e) = up.flush_part(object).await
                    {
                        break 'run Some(e);
                    }
                    break;
                }
            }
            if !refused.is_empty() {
                let n = refused.len() as u64;
                if cx.dead.is_connected() {
                    let events = refused
                        .into_iter()
                        .map(|(e, why)| attach_error(e, &cx.id, &why))
                        .collect();
                    if cx.dead.send(events).await.is_err() {
                        return Err(StageError::Other(format!(
                            "{n} refused events could not go to `{}.dead`: its readers stopped",
                            cx.id
                        )));
                    }
                } else {
                    if !warned_refused {
                        warned_refused = true;
                        tracing::warn!(stage = %cx.id, "{n} events refused and counted errored: {} (connect `{}.dead` to keep them; further ones not logged)", refused[0].1, cx.id);
                    }
                    for (mut e, _) in refused {
                        e.settle(Outcome::Rejected);
                    }
                    cx.metrics.add_errored(n);
                }
            }
            // The batch's events are encoded: its channel slots return.
            drop(batch);
        };
        let failure = match failure {
            Some(e) => Some(e),
            None => {
                // The input ended: every open object is finished.
                let mut failed = None;
                for (_, object) in open.drain() {
                    if failed.is_some() {
                        up.give_up(object).await;
                        continue;
                    }
                    match up.finish(object).await {
                        Ok(n) => cx.committed(n as usize),
                        Err(e) => failed = Some(e),
                    }
                }
                failed
            }
        };
        let Some(failure) = failure else {
            return Ok(());
        };
        let mut held = 0;
        for (_, object) in open.drain() {
            held += up.give_up(object).await;
        }
        Err(StageError::Other(format!(
            "{}{}",
            failure.message,
            if held > 0 {
                format!(
                    "; {held} events of unfinished objects were not written (a checkpointing source sends them again)"
                )
            } else {
                String::new()
            }
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An upload has parts 1 to 10,000; the part after the last is refused
    /// before it is sent.
    #[test]
    fn parts_are_numbered_from_one_to_ten_thousand() {
        assert_eq!(next_part_number(0), Some(1));
        assert_eq!(next_part_number(9_998), Some(9_999));
        assert_eq!(next_part_number(9_999), Some(10_000));
        assert_eq!(next_part_number(10_000), None);
        assert_eq!(next_part_number(usize::MAX - 1), None);
    }
}
