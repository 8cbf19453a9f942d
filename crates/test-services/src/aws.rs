//! What the S3 tests share: the S3-compatible server `.ci/services up s3`
//! starts (MinIO on 127.0.0.1:9002, or `LOGBUS_S3_ENDPOINT`), its keys,
//! and boto3, the independent client that creates buckets and reads back
//! what the sink wrote. The tests that need them are ignored unless run
//! with `--include-ignored` (CI does); then a missing server or boto3 fails
//! them.

use serde_json::Value;

pub const ACCESS_KEY: &str = "logbus";
pub const SECRET_KEY: &str = "logbus-secret";

/// The S3 server's URL; fails the test unless it answers and boto3 is
/// installed.
pub fn endpoint() -> String {
    let url =
        std::env::var("LOGBUS_S3_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:9002".into());
    crate::require_listening(
        url.trim_start_matches("http://").trim_end_matches('/'),
        "an S3 server (.ci/services up s3, or set LOGBUS_S3_ENDPOINT)",
    );
    crate::require_python("boto3", "pip install boto3");
    url
}

/// Runs a boto3 snippet with `s3` (a client of the test server) and
/// `ARGS` set; returns its stdout.
pub fn python(endpoint: &str, script: &str, args: &[&str]) -> String {
    crate::python(
        &format!(
            "import base64, boto3\n\
             s3 = boto3.client('s3', endpoint_url={endpoint:?}, region_name='us-east-1',\n\
             \x20   aws_access_key_id={ACCESS_KEY:?}, aws_secret_access_key={SECRET_KEY:?})"
        ),
        script,
        args,
    )
}

/// A fresh, empty bucket.
pub fn bucket(endpoint: &str, name: &str) -> String {
    let name = format!(
        "{name}-{}-{}",
        std::process::id(),
        crate::now_ns() % 1_000_000_000
    );
    python(endpoint, "s3.create_bucket(Bucket=ARGS[0])", &[&name]);
    name
}

/// One stored object, as boto3 reads it.
#[derive(Debug)]
pub struct Object {
    pub key: String,
    /// Decompressed by Python's own gzip/zlib/zstandard/lz4 modules (by the
    /// key's extension).
    pub text: String,
    pub etag: String,
    pub content_encoding: Option<String>,
    pub content_type: String,
    pub size: u64,
}

/// Every object of `bucket`, by key.
pub fn objects(endpoint: &str, bucket: &str) -> Vec<Object> {
    let out = python(
        endpoint,
        "import gzip, zlib, zstandard, lz4.frame, io\n\
         keys = [o['Key'] for p in s3.get_paginator('list_objects_v2').paginate(Bucket=ARGS[0]) for o in p.get('Contents', [])]\n\
         out = []\n\
         for k in sorted(keys):\n\
         \x20   r = s3.get_object(Bucket=ARGS[0], Key=k)\n\
         \x20   b = r['Body'].read()\n\
         \x20   if k.endswith('.gz'): b = gzip.decompress(b)\n\
         \x20   elif k.endswith('.zst'): b = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(b)).read()\n\
         \x20   elif k.endswith('.lz4'): b = lz4.frame.decompress(b)\n\
         \x20   elif k.endswith('.zz'): b = zlib.decompress(b)\n\
         \x20   out.append({'key': k, 'text': b.decode(), 'etag': r['ETag'], 'size': r['ContentLength'],\n\
         \x20               'encoding': r.get('ContentEncoding'), 'type': r['ContentType']})\n\
         print(json.dumps(out))",
        &[bucket],
    );
    let list: Vec<Value> = serde_json::from_str(out.trim()).unwrap();
    list.into_iter()
        .map(|o| Object {
            key: o["key"].as_str().unwrap().to_string(),
            text: o["text"].as_str().unwrap().to_string(),
            etag: o["etag"].as_str().unwrap().to_string(),
            content_encoding: o["encoding"].as_str().map(str::to_string),
            content_type: o["type"].as_str().unwrap().to_string(),
            size: o["size"].as_u64().unwrap(),
        })
        .collect()
}

/// Multipart uploads started and neither completed nor aborted.
pub fn unfinished_uploads(endpoint: &str, bucket: &str) -> usize {
    python(
        endpoint,
        "print(len(s3.list_multipart_uploads(Bucket=ARGS[0]).get('Uploads', [])))",
        &[bucket],
    )
    .trim()
    .parse()
    .unwrap()
}

/// Parts stored so far for the multipart uploads under way in `bucket`.
pub fn uploaded_parts(endpoint: &str, bucket: &str) -> usize {
    python(
        endpoint,
        "ups = s3.list_multipart_uploads(Bucket=ARGS[0]).get('Uploads', [])\n\
         print(sum(len(s3.list_parts(Bucket=ARGS[0], Key=u['Key'], UploadId=u['UploadId']).get('Parts', [])) for u in ups))",
        &[bucket],
    )
    .trim()
    .parse()
    .unwrap()
}

/// The CloudWatch Logs test server (`moto_server`, `.ci/services up
/// cloudwatch`, on 127.0.0.1:4566, or `LOGBUS_CLOUDWATCH_ENDPOINT`).
/// Fails the test unless it answers (the tests that call this are ignored
/// unless run with `--include-ignored`).
pub fn cloudwatch() -> String {
    let url = std::env::var("LOGBUS_CLOUDWATCH_ENDPOINT")
        .unwrap_or_else(|_| "http://127.0.0.1:4566".into());
    crate::require_listening(
        url.trim_start_matches("http://").trim_end_matches('/'),
        "a CloudWatch Logs server (pip install 'moto[server]'; .ci/services up cloudwatch)",
    );
    url
}

/// Runs a boto3 snippet with `logs` (a CloudWatch Logs client of the
/// test server) and `ARGS` set; returns its stdout.
pub fn logs_python(endpoint: &str, script: &str, args: &[&str]) -> String {
    crate::python(
        &format!(
            "import boto3\n\
             logs = boto3.client('logs', endpoint_url={endpoint:?}, region_name='us-east-1',\n\
             \x20   aws_access_key_id='test', aws_secret_access_key='test')"
        ),
        script,
        args,
    )
}

/// The records of every Parquet (`.parquet`, by pyarrow) or Avro container
/// (`.avro`, by fastavro) object of `bucket`, by key: `(key, content
/// type, row groups or blocks, records)`.
pub fn records(endpoint: &str, bucket: &str) -> Vec<(String, String, u64, Vec<Value>)> {
    let out = python(
        endpoint,
        "import io, pyarrow.parquet as pq, fastavro\n\
         keys = [o['Key'] for p in s3.get_paginator('list_objects_v2').paginate(Bucket=ARGS[0]) for o in p.get('Contents', [])]\n\
         out = []\n\
         for k in sorted(keys):\n\
         \x20   r = s3.get_object(Bucket=ARGS[0], Key=k)\n\
         \x20   b = r['Body'].read()\n\
         \x20   if k.endswith('.parquet'):\n\
         \x20       f = pq.ParquetFile(io.BytesIO(b))\n\
         \x20       groups, rows = f.metadata.num_row_groups, f.read().to_pylist()\n\
         \x20   else:\n\
         \x20       blocks = list(fastavro.block_reader(io.BytesIO(b)))\n\
         \x20       groups, rows = len(blocks), [x for blk in blocks for x in blk]\n\
         \x20   out.append([k, r['ContentType'], groups, rows])\n\
         print(json.dumps(out))",
        &[bucket],
    );
    serde_json::from_str(out.trim()).unwrap()
}

/// `(key, etag, size)` of every object of `bucket`, by key.
pub fn objects_meta(endpoint: &str, bucket: &str) -> Vec<(String, String, u64)> {
    let out = python(
        endpoint,
        "out = [[o['Key'], o['ETag'], o['Size']] for p in s3.get_paginator('list_objects_v2').paginate(Bucket=ARGS[0]) for o in p.get('Contents', [])]\n\
         print(json.dumps(sorted(out)))",
        &[bucket],
    );
    serde_json::from_str(out.trim()).unwrap()
}

/// `base` with the entries of `more` added (or replaced): one option set
/// and its variations.
pub fn merged(base: Value, more: Value) -> Value {
    let mut o = base;
    o.as_object_mut()
        .expect("an object")
        .extend(more.as_object().expect("an object").clone());
    o
}

/// A TCP proxy in front of the S3 server that cuts object downloads short,
/// as a network or a server failing mid-body would: the n-th GET of an
/// object (n from 1) gets `cut(key, n)` bytes of its answer, head included,
/// before both connections are closed; `None` lets it through whole.
/// Listings pass untouched. `gets` counts each key's GETs, so a test can
/// show its cuts happened.
pub struct CuttingProxy {
    pub url: String,
    pub gets: std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, usize>>>,
}

impl CuttingProxy {
    pub fn gets_of(&self, key: &str) -> usize {
        self.gets.lock().unwrap().get(key).copied().unwrap_or(0)
    }
}

type Cut = dyn Fn(&str, usize) -> Option<usize> + Send + Sync;

pub fn cutting_proxy(
    upstream: &str,
    cut: impl Fn(&str, usize) -> Option<usize> + Send + Sync + 'static,
) -> CuttingProxy {
    use std::net::{TcpListener, TcpStream};
    use std::sync::{Arc, Mutex};
    let upstream = upstream
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let gets = Arc::new(Mutex::new(std::collections::BTreeMap::new()));
    let cut: Arc<Cut> = Arc::new(cut);
    let counted = gets.clone();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = TcpStream::connect(&upstream) else {
                continue;
            };
            // What the answer now being forwarded may still carry.
            let allowance: Arc<Mutex<Option<usize>>> = Arc::default();
            let (c, s) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (cut, gets, allow) = (cut.clone(), counted.clone(), allowance.clone());
            std::thread::spawn(move || requests(c, s, &*cut, &gets, &allow));
            std::thread::spawn(move || answers(server, client, &allowance));
        }
    });
    CuttingProxy { url, gets }
}

/// Client to server: each request's line sets the allowance of its answer
/// before the request goes on (the SDK sends a request's head in one
/// piece, and the next only after the answer).
fn requests(
    mut from: std::net::TcpStream,
    mut to: std::net::TcpStream,
    cut: &Cut,
    gets: &std::sync::Mutex<std::collections::BTreeMap<String, usize>>,
    allowance: &std::sync::Mutex<Option<usize>>,
) {
    use std::io::{Read, Write};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let text = String::from_utf8_lossy(&buf[..n]);
        for line in text.lines().filter(|l| l.starts_with("GET /")) {
            let path = line.split(' ').nth(1).unwrap_or("");
            let (path, query) = path.split_once('?').unwrap_or((path, ""));
            // `/bucket/key`: an object; a listing has no key or says `list-type`.
            let key = path.trim_start_matches('/').split_once('/').map(|(_, k)| k);
            let mut allow = allowance.lock().unwrap();
            *allow = match key {
                Some(key) if !key.is_empty() && !query.contains("list-type") => {
                    let mut gets = gets.lock().unwrap();
                    let n = gets.entry(key.to_string()).or_insert(0);
                    *n += 1;
                    cut(key, *n)
                }
                _ => None,
            };
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// Server to client, closing both connections once an answer has used up
/// its allowance.
fn answers(
    mut from: std::net::TcpStream,
    mut to: std::net::TcpStream,
    allowance: &std::sync::Mutex<Option<usize>>,
) {
    use std::io::{Read, Write};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut allow = allowance.lock().unwrap();
        let pass = allow.map_or(n, |left| left.min(n));
        if to.write_all(&buf[..pass]).is_err() {
            break;
        }
        if let Some(left) = allow.as_mut() {
            *left -= pass;
            if *left == 0 {
                break;
            }
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
    let _ = from.shutdown(std::net::Shutdown::Both);
}
