//! What every AWS plugin needs to reach its service: region, endpoint
//! (an S3-compatible store, a local test server) and credentials, the
//! standard chain unless keys are given. The SDK's own HTTPS client would
//! bring aws-lc (a C build); its hyper client with rustls on ring is used
//! instead, as in the rest of the workspace. The SDK's retries are off:
//! the plugins retry under the sink core's policy, so every sink has the
//! same knobs and counts its retries the same way.

use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_credential_types::Credentials;
use logbus_plugin_api::OptionError;
use serde::Deserialize;

/// Options shared by the AWS plugins.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
pub struct AwsOptions {
    /// The region (else `AWS_REGION`, the profile's, then `us-east-1`).
    pub region: Option<String>,
    /// The service's URL, for S3-compatible stores and local servers
    /// (`http://127.0.0.1:9000`); empty or unset: AWS's own.
    pub endpoint: Option<String>,
    /// Bucket in the path (`endpoint/bucket/key`) instead of the host
    /// name; most S3-compatible stores need it.
    #[serde(default)]
    pub force_path_style: bool,
    /// Static credentials (write `${VAR}` to take them from the
    /// environment). Without them: the standard chain (`AWS_ACCESS_KEY_ID`
    /// and friends, the shared profile, web identity, the instance's role).
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
    /// A named profile of `~/.aws/config` for the standard chain.
    pub profile: Option<String>,
}

impl AwsOptions {
    /// The endpoint, if one is set (an empty one, as `${S3_ENDPOINT:-}`
    /// gives, means AWS's own).
    pub fn endpoint(&self) -> Option<&str> {
        self.endpoint.as_deref().filter(|e| !e.is_empty())
    }

    pub fn check(&self) -> Vec<OptionError> {
        let mut errors = Vec::new();
        match (&self.access_key_id, &self.secret_access_key) {
            (Some(_), None) => errors.push(OptionError::at(
                &["secret_access_key"],
                "is needed with `access_key_id`",
            )),
            (None, Some(_)) => errors.push(OptionError::at(
                &["access_key_id"],
                "is needed with `secret_access_key`",
            )),
            _ => {}
        }
        if self.session_token.is_some() && self.access_key_id.is_none() {
            errors.push(OptionError::at(
                &["session_token"],
                "goes with `access_key_id` and `secret_access_key`",
            ));
        }
        if self.profile.is_some() && self.access_key_id.is_some() {
            errors.push(OptionError::at(
                &["profile"],
                "static keys and a profile exclude each other",
            ));
        }
        if let Some(url) = self.endpoint()
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            errors.push(OptionError::at(
                &["endpoint"],
                format!("`{url}` is not an http:// or https:// URL"),
            ));
        }
        errors
    }
}

/// The SDK configuration these options describe.
pub async fn sdk_config(o: &AwsOptions) -> aws_config::SdkConfig {
    use aws_smithy_http_client::tls;
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https();
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .http_client(http)
        .retry_config(RetryConfig::disabled());
    if let Some(region) = &o.region {
        loader = loader.region(aws_config::Region::new(region.clone()));
    }
    if let Some(url) = o.endpoint() {
        loader = loader.endpoint_url(url);
    }
    if let Some(profile) = &o.profile {
        loader = loader.profile_name(profile);
    }
    if let (Some(id), Some(secret)) = (&o.access_key_id, &o.secret_access_key) {
        loader = loader.credentials_provider(Credentials::new(
            id,
            secret,
            o.session_token.clone(),
            None,
            "logbus pipeline options",
        ));
    }
    let config = loader.load().await;
    if config.region().is_some() {
        return config;
    }
    config
        .into_builder()
        .region(aws_config::Region::new("us-east-1"))
        .build()
}

/// A failed SDK request in words, and whether a retry could succeed:
/// timeouts, dispatch failures, 408, 429 and 5xx answers, and the error
/// codes in `also_retryable` (a service's throttling codes) are worth a
/// retry; a request the SDK could not even build and every other answer
/// are not.
pub fn describe<E>(
    e: &aws_smithy_runtime_api::client::result::SdkError<E, aws_smithy_runtime_api::http::Response>,
    also_retryable: &[&str],
) -> (String, bool)
where
    E: aws_smithy_types::error::metadata::ProvideErrorMetadata
        + std::error::Error
        + Send
        + Sync
        + 'static,
{
    use aws_smithy_runtime_api::client::result::SdkError;
    match e {
        SdkError::ServiceError(service) => {
            let status = service.raw().status().as_u16();
            let err = service.err();
            let code = err.code().unwrap_or("no error code");
            let retryable =
                matches!(status, 408 | 429 | 500..=599) || also_retryable.contains(&code);
            (
                format!("{code} (HTTP {status}): {}", err.message().unwrap_or("")),
                retryable,
            )
        }
        SdkError::ConstructionFailure(_) => (logbus_sink::error_chain(e), false),
        other => (logbus_sink::error_chain(other), true),
    }
}

/// An S3 client as the stage configures it.
#[cfg(any(feature = "sink-s3", feature = "source-s3"))]
pub async fn s3_client(o: &AwsOptions) -> aws_sdk_s3::Client {
    let config = sdk_config(o).await;
    aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(&config)
            .force_path_style(o.force_path_style)
            .build(),
    )
}

/// Error codes by which AWS and S3-compatible stores refuse the
/// credentials themselves (not a permission).
const BAD_CREDENTIALS: &[&str] = &[
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "UnrecognizedClientException",
    "InvalidSignatureException",
    "InvalidClientTokenId",
    "ExpiredToken",
    "ExpiredTokenException",
];

/// What a failed probe request means for `validate --connect`: the store
/// not reached, the credentials refused, the thing named missing (one of
/// `missing_codes`, at `missing_at`), or a permission denied (an error,
/// or a warning where the stage may hold a narrower permission than the
/// probe needs: `denied_is_warning`).
pub fn probe_finding<E>(
    e: &aws_smithy_runtime_api::client::result::SdkError<E, aws_smithy_runtime_api::http::Response>,
    service: &str,
    missing_codes: &[&str],
    missing_at: &[&str],
    denied_is_warning: bool,
) -> logbus_plugin_api::ServiceFinding
where
    E: aws_smithy_types::error::metadata::ProvideErrorMetadata
        + std::error::Error
        + Send
        + Sync
        + 'static,
{
    use aws_smithy_runtime_api::client::result::SdkError;
    use logbus_plugin_api::ServiceFinding;
    use logbus_plugin_api::connect::{MISSING, REFUSED, UNREACHABLE};
    let (words, _) = describe(e, &[]);
    let SdkError::ServiceError(answer) = e else {
        return ServiceFinding::error(UNREACHABLE, &["endpoint"], format!("{service}: {words}"));
    };
    let code = answer.err().code().unwrap_or("");
    let status = answer.raw().status().as_u16();
    if missing_codes.contains(&code) {
        ServiceFinding::error(MISSING, missing_at, format!("{service}: {words}"))
    } else if BAD_CREDENTIALS.contains(&code) {
        ServiceFinding::error(
            REFUSED,
            &["access_key_id"],
            format!("{service} refused the credentials: {words}"),
        )
    } else if matches!(status, 401 | 403) && denied_is_warning {
        ServiceFinding::warning(
            REFUSED,
            missing_at,
            format!(
                "{service}: {words} (the probe needs to list; a policy that only lets the stage write would refuse it too)"
            ),
        )
    } else {
        ServiceFinding::error(REFUSED, missing_at, format!("{service}: {words}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_smithy_runtime_api::client::result::{ConnectorError, SdkError};
    use aws_smithy_runtime_api::http::{Response, StatusCode};
    use aws_smithy_types::body::SdkBody;
    use aws_smithy_types::error::ErrorMetadata;

    type Failed = SdkError<ErrorMetadata, Response>;

    fn answered(status: u16, code: Option<&str>) -> Failed {
        let mut error = ErrorMetadata::builder().message("said the service");
        if let Some(code) = code {
            error = error.code(code);
        }
        let raw = Response::new(StatusCode::try_from(status).unwrap(), SdkBody::empty());
        SdkError::service_error(error.build(), raw)
    }

    /// What the service answered is worth a retry for a timeout, throttling
    /// and its own failures (408, 429, 5xx) and for the codes a plugin names,
    /// never for the rest; the words carry the code, the status and the
    /// service's message.
    #[test]
    fn a_service_answer_is_retried_by_its_status_or_a_named_code() {
        for (status, retried) in [
            (400, false),
            (403, false),
            (404, false),
            (407, false),
            (408, true),
            (409, false),
            (428, false),
            (429, true),
            (430, false),
            (499, false),
            (500, true),
            (503, true),
            (599, true),
        ] {
            let (words, retryable) = describe(&answered(status, Some("Code")), &[]);
            assert_eq!(retryable, retried, "HTTP {status}");
            assert_eq!(words, format!("Code (HTTP {status}): said the service"));
        }
        let throttled = answered(400, Some("ThrottlingException"));
        assert!(describe(&throttled, &["SlowDown", "ThrottlingException"]).1);
        assert!(
            !describe(&throttled, &["SlowDown"]).1,
            "only the codes named"
        );
        let (words, retryable) = describe(&answered(403, None), &["SlowDown"]);
        assert_eq!(words, "no error code (HTTP 403): said the service");
        assert!(!retryable);
    }

    /// A request that could not be built never will be; one that got no
    /// answer (timed out, not delivered) may get one next time.
    #[test]
    fn a_request_without_an_answer_is_retried_unless_it_could_not_be_built() {
        let built_wrong: Failed = SdkError::construction_failure("no bucket given");
        let (words, retryable) = describe(&built_wrong, &[]);
        assert!(!retryable);
        assert!(words.contains("no bucket given"), "{words}");
        let timed_out: Failed = SdkError::timeout_error("took too long");
        let (words, retryable) = describe(&timed_out, &[]);
        assert!(retryable);
        assert!(words.contains("took too long"), "{words}");
        let refused: Failed = SdkError::dispatch_failure(ConnectorError::io(
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into(),
        ));
        let (words, retryable) = describe(&refused, &[]);
        assert!(retryable);
        assert!(words.to_lowercase().contains("refused"), "{words}");
    }
}
