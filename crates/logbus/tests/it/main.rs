//! Integration tests of the engine with the plugins of this build: the
//! validator's every error, the runtime's backpressure, fan-in/fan-out,
//! error routing, shutdown, and the `logbus` command itself.

mod api;
mod attached;
mod cli;
#[cfg(feature = "sink-clickhouse")]
mod clickhouse;
// The ClickHouse plugin's test helpers (servers, SQL over HTTP), shared.
#[cfg(feature = "sink-clickhouse")]
#[path = "../../../../plugins/clickhouse/tests/common/mod.rs"]
mod clickhouse_common;
mod compress;
mod connect;
mod crash;
mod durable;
mod edge_agent;
mod flow;
mod fuse;
mod hostile;
mod js;
#[cfg(feature = "source-kafka")]
mod kafka;
// The Kafka plugin's test helpers (broker, kafka-python), shared.
#[cfg(feature = "source-kafka")]
#[path = "../../../../plugins/kafka/tests/common/mod.rs"]
mod kafka_common;
#[cfg(feature = "sink-opensearch")]
mod opensearch;
// The OpenSearch plugin's test helpers (node, opensearch-py), shared.
#[cfg(feature = "sink-opensearch")]
#[path = "../../../../plugins/opensearch/tests/common/mod.rs"]
mod opensearch_common;
mod preflight;
mod reload;
mod route;
mod runtime;
#[cfg(feature = "sink-s3")]
mod s3;
// The AWS plugins' test helpers (MinIO, boto3), shared.
#[cfg(feature = "sink-s3")]
#[path = "../../../../plugins/aws/tests/common/mod.rs"]
mod s3_common;
mod schema;
mod support;
mod tail;
mod ui;
mod validate;
mod workers;
