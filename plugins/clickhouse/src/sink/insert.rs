//! The insert: each event encoded as a RowBinary row for the table's own
//! column types, and the service that sends a batch of rows with the
//! `clickhouse` crate's HTTP client, telling a refusal of the data (a row
//! at fault: the batch is split until it is alone) from a failure worth
//! retrying whole (the network, a timeout, the server's transient errors).

use std::ops::Range;
use std::time::Duration;

use logbus_plugin_api::{Bytes, Event, async_trait};
use logbus_sink::{Batch, Encoder, ItemResult, Response, Service, error_chain};

use super::Column;

/// One RowBinary row per event, in the insert's column order.
pub(super) struct RowEncoder {
    pub(super) columns: Vec<Column>,
}

impl Encoder for RowEncoder {
    fn encode(&self, event: &Event, out: &mut Vec<u8>) -> Result<(), String> {
        let Some(fields) = event.as_fields() else {
            return Err("a raw event cannot be a ClickHouse row: parse it first".into());
        };
        for c in &self.columns {
            c.kind
                .encode(c.path.get(fields), out)
                .map_err(|e| format!("column `{}`: {e}", c.name))?;
        }
        Ok(())
    }
}

/// One insert: the rows' bytes, and where each row is in them.
pub(super) struct RowsRequest {
    pub(super) body: Bytes,
    pub(super) rows: Vec<Range<usize>>,
    /// With `deduplicate`: the token of this request, kept across its
    /// retries (a batch shrunk by a partial failure gets a new one).
    pub(super) token: Option<String>,
}

pub(super) struct ClickHouseService {
    pub(super) client: clickhouse::Client,
    pub(super) insert: String,
    pub(super) timeout: Duration,
    pub(super) deduplicate: bool,
}

/// What a failed insert means.
pub(super) enum Failure {
    /// The server refused the data: some row in it is at fault.
    Data(String),
    /// Trying again may work (network, timeout, the server's own trouble).
    Transient(String),
}

/// Error codes meaning "the data of this insert is wrong": a row the
/// server cannot take, not a server in trouble.
pub(super) const DATA_ERRORS: &[u32] = &[
    6,   // CANNOT_PARSE_TEXT
    26,  // CANNOT_PARSE_QUOTED_STRING
    27,  // CANNOT_PARSE_INPUT_ASSERTION_FAILED
    33,  // CANNOT_READ_ALL_DATA
    36,  // BAD_ARGUMENTS
    38,  // CANNOT_PARSE_DATE
    41,  // CANNOT_PARSE_DATETIME
    43,  // ILLEGAL_TYPE_OF_ARGUMENT
    53,  // TYPE_MISMATCH
    69,  // ARGUMENT_OUT_OF_BOUND
    70,  // CANNOT_CONVERT_TYPE
    72,  // CANNOT_PARSE_NUMBER
    117, // INCORRECT_DATA
    131, // TOO_LARGE_STRING_SIZE
    321, // VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE
    349, // CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN
    395, // FUNCTION_THROW_IF_VALUE_IS_NON_ZERO
    469, // VIOLATED_CONSTRAINT
];

/// The `Code: N` of a server exception.
pub(super) fn error_code(text: &str) -> Option<u32> {
    let at = text.find("Code: ")? + 6;
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

impl ClickHouseService {
    async fn insert(&self, rows: Bytes, token: Option<String>) -> Result<(), Failure> {
        let attempt = async {
            let mut insert = self
                .client
                .insert_formatted_with(self.insert.clone())
                .with_timeouts(Some(self.timeout), Some(self.timeout));
            if let Some(token) = token {
                insert = insert.with_setting("insert_deduplication_token", token);
            }
            insert.send(rows).await?;
            insert.end().await
        };
        let result = tokio::time::timeout(self.timeout * 2, attempt)
            .await
            .map_err(|_| Failure::Transient(format!("no answer within {:?}", self.timeout * 2)))?;
        match result {
            Ok(()) => Ok(()),
            Err(clickhouse::error::Error::BadResponse(text)) => {
                let text = text.trim().to_string();
                match error_code(&text) {
                    Some(code) if DATA_ERRORS.contains(&code) => Err(Failure::Data(text)),
                    _ => Err(Failure::Transient(text)),
                }
            }
            Err(e) => Err(Failure::Transient(error_chain(&e))),
        }
    }
}

#[async_trait]
impl Service for ClickHouseService {
    type Request = RowsRequest;

    fn prepare(&self, batch: &Batch) -> Result<RowsRequest, String> {
        Ok(RowsRequest {
            body: Bytes::copy_from_slice(batch.body()),
            rows: batch.items().to_vec(),
            // The batch's journal name, the same after a crash; without a
            // journal, a name of this request's own (kept across its
            // retries).
            token: self.deduplicate.then(|| match batch.identity() {
                Some(id) => format!("logbus-{}", id.hex()),
                None => format!("logbus-{:032x}", fastrand::u128(..)),
            }),
        })
    }

    async fn send(&self, request: &RowsRequest) -> Response {
        let failure = match self
            .insert(request.body.clone(), request.token.clone())
            .await
        {
            Ok(()) => return Response::Delivered,
            Err(Failure::Transient(reason)) => {
                return Response::Retry {
                    reason,
                    retry_after: None,
                };
            }
            Err(Failure::Data(reason)) => reason,
        };
        if request.rows.len() == 1 {
            return Response::Items(vec![ItemResult::Rejected(failure)]);
        }
        // Split until the refused rows are alone. Rows are contiguous in
        // the body, so a half is a slice of it, not a copy.
        let mut results: Vec<Option<ItemResult>> = vec![None; request.rows.len()];
        let mid = request.rows.len() / 2;
        let mut pending: Vec<Range<usize>> = vec![mid..request.rows.len(), 0..mid];
        while let Some(part) = pending.pop() {
            let bytes = request
                .body
                .slice(request.rows[part.start].start..request.rows[part.end - 1].end);
            // A part of the batch is its own insert, with its own token.
            let token = request
                .token
                .as_ref()
                .map(|t| format!("{t}-{}-{}", part.start, part.end));
            match self.insert(bytes, token).await {
                Ok(()) => part
                    .clone()
                    .for_each(|i| results[i] = Some(ItemResult::Delivered)),
                Err(Failure::Data(reason)) if part.len() == 1 => {
                    results[part.start] = Some(ItemResult::Rejected(reason));
                }
                Err(Failure::Data(_)) => {
                    let mid = part.start + part.len() / 2;
                    pending.push(mid..part.end);
                    pending.push(part.start..mid);
                }
                Err(Failure::Transient(reason)) => {
                    // What is not stored yet is sent again later.
                    for i in part.chain(pending.drain(..).flatten()) {
                        results[i] = Some(ItemResult::Retry(reason.clone()));
                    }
                }
            }
        }
        Response::Items(
            results
                .into_iter()
                .map(|r| r.expect("every row has an outcome"))
                .collect(),
        )
    }
}
