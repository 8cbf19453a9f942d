//! The object driver against a scripted store. What is under test is the
//! driver's bookkeeping (when an object is finished, when its events are
//! confirmed, what is retried, aborted, dead-lettered), so the store is an
//! in-memory map whose answers a test scripts; the S3 store itself is
//! tested against a real S3 server in `plugins/aws/tests/s3_sink.rs`. Time
//! is paused (tokio's test clock), so ageing and backoff are exact.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use logbus_plugin_api::{
    AckReceiver, BatchAck, Event, Meta, Outcome, Output, OutputRole, SinkContext, StageMetrics,
    async_trait, channel,
};
use logbus_sink::{
    Attempt, Misfit, ObjectConfig, ObjectDriver, ObjectFormat, ObjectStore, ObjectWriter,
    RetryPolicy,
};

/// Outcome per event, by its number.
#[derive(Default)]
struct Heard(Mutex<BTreeMap<u64, Outcome>>);
impl AckReceiver for Heard {
    fn finished(&self, token: u64, outcome: Outcome) {
        assert!(self.0.lock().unwrap().insert(token, outcome).is_none());
    }
}

/// Events `"<prefix> <n>"`, each with its own acknowledgement.
fn events(heard: &Arc<Heard>, prefix: &str, range: std::ops::Range<u64>) -> Vec<Event> {
    range
        .map(|i| {
            let ack = BatchAck::new(heard.clone(), i);
            Event::raw(format!("{prefix} {i}"), Meta::at("t", 0)).with_ack(ack.handle())
        })
        .collect()
}

/// Lines; an event starting with `never` fits no object, one starting
/// with `next` does not fit an object that already holds events.
struct Lines;
struct LinesObject {
    ready: Vec<u8>,
    size: u64,
}
impl ObjectFormat for Lines {
    fn open(&self) -> Result<Box<dyn ObjectWriter>, String> {
        Ok(Box::new(LinesObject {
            ready: Vec::new(),
            size: 0,
        }))
    }
}
impl ObjectWriter for LinesObject {
    fn write(&mut self, event: &Event) -> Result<(), Misfit> {
        let line = event.as_raw().expect("raw events");
        if line.starts_with(b"never") {
            return Err(Misfit::Never("a never event".into()));
        }
        if line.starts_with(b"next") && self.size > 0 {
            return Err(Misfit::NextObject("a next event".into()));
        }
        self.ready.extend_from_slice(line);
        self.ready.push(b'\n');
        self.size += line.len() as u64 + 1;
        Ok(())
    }
    fn ready(&mut self) -> &mut Vec<u8> {
        &mut self.ready
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn finish(self: Box<Self>) -> Result<Vec<u8>, String> {
        Ok(self.ready)
    }
}

/// Which store call an answer is scripted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Call {
    Put,
    Start,
    Part,
    Complete,
}

type Script = dyn Fn(Call, usize) -> Option<Attempt<()>> + Send + Sync;

/// Objects in memory. `script(call, nth)` may answer the nth call (from 1)
/// of its kind instead of the store; `None` lets it through.
struct Memory {
    objects: Mutex<BTreeMap<String, Vec<u8>>>,
    uploads: Mutex<HashMap<String, Vec<Vec<u8>>>>,
    calls: Mutex<HashMap<Call, usize>>,
    aborted: Mutex<Vec<String>>,
    script: Box<Script>,
}

fn memory(script: impl Fn(Call, usize) -> Option<Attempt<()>> + Send + Sync + 'static) -> Memory {
    Memory {
        objects: Mutex::default(),
        uploads: Mutex::default(),
        calls: Mutex::default(),
        aborted: Mutex::default(),
        script: Box::new(script),
    }
}

impl Memory {
    fn scripted(&self, call: Call) -> Option<Attempt<()>> {
        let nth = {
            let mut calls = self.calls.lock().unwrap();
            let n = calls.entry(call).or_default();
            *n += 1;
            *n
        };
        (self.script)(call, nth)
    }

    fn calls(&self, call: Call) -> usize {
        self.calls.lock().unwrap().get(&call).copied().unwrap_or(0)
    }

    /// Stored objects' lines, by key.
    fn lines(&self) -> BTreeMap<String, Vec<String>> {
        self.objects
            .lock()
            .unwrap()
            .iter()
            .map(|(k, v)| {
                let text = String::from_utf8(v.clone()).unwrap();
                (k.clone(), text.lines().map(str::to_string).collect())
            })
            .collect()
    }
}

#[async_trait]
impl ObjectStore for Memory {
    type Upload = String;
    type Part = usize;
    const MAX_PARTS: usize = 3;

    fn key(&self, prefix: &str) -> String {
        let n = self.objects.lock().unwrap().len() + self.uploads.lock().unwrap().len();
        format!("{prefix}/{n}")
    }

    async fn put(&self, key: &str, body: &Bytes) -> Attempt<()> {
        if let Some(answer) = self.scripted(Call::Put) {
            return answer;
        }
        self.objects
            .lock()
            .unwrap()
            .insert(key.to_string(), body.to_vec());
        Attempt::Done(())
    }

    async fn start(&self, key: &str) -> Attempt<String> {
        if let Some(answer) = self.scripted(Call::Start) {
            return answer.map(|()| String::new());
        }
        self.uploads
            .lock()
            .unwrap()
            .insert(key.to_string(), Vec::new());
        Attempt::Done(key.to_string())
    }

    async fn put_part(
        &self,
        _key: &str,
        upload: &String,
        number: usize,
        body: &Bytes,
    ) -> Attempt<usize> {
        if let Some(answer) = self.scripted(Call::Part) {
            return answer.map(|()| 0);
        }
        let mut uploads = self.uploads.lock().unwrap();
        let parts = uploads.get_mut(upload).expect("started");
        parts.resize(parts.len().max(number), Vec::new());
        parts[number - 1] = body.to_vec();
        Attempt::Done(number)
    }

    async fn complete(&self, key: &str, upload: &String, parts: &[usize]) -> Attempt<()> {
        if let Some(answer) = self.scripted(Call::Complete) {
            return answer;
        }
        let stored = self
            .uploads
            .lock()
            .unwrap()
            .remove(upload)
            .expect("started");
        let body = parts.iter().flat_map(|n| stored[n - 1].clone()).collect();
        self.objects.lock().unwrap().insert(key.to_string(), body);
        Attempt::Done(())
    }

    async fn abort(&self, key: &str, upload: &String) -> Result<(), String> {
        self.uploads.lock().unwrap().remove(upload);
        self.aborted.lock().unwrap().push(key.to_string());
        Ok(())
    }
}

fn config() -> ObjectConfig {
    ObjectConfig {
        max_object_bytes: 1 << 20,
        max_object_age: Duration::from_secs(60),
        max_object_events: None,
        part_size_bytes: 1 << 20,
        max_open_objects: 8,
        retry: RetryPolicy {
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_secs(1),
            max_attempts: Some(4),
            max_elapsed: None,
        },
        request_timeout: Duration::from_secs(5),
        destination: "mem://bucket".into(),
    }
}

/// The prefix is the event's first word.
fn driver(store: Memory, config: ObjectConfig) -> ObjectDriver<Memory> {
    ObjectDriver::new(
        store,
        Box::new(Lines),
        |e: &Event| {
            let line = String::from_utf8_lossy(e.as_raw().unwrap()).into_owned();
            line.split(' ').next().unwrap().to_string()
        },
        config,
    )
}

struct Run {
    result: Result<(), String>,
    metrics: Arc<StageMetrics>,
    dead: Vec<Event>,
}

/// Sends `batches` (each one input batch), then ends the input, unless
/// `keep_open`: then the input stays open and the test's `during` runs.
async fn run(
    driver: &ObjectDriver<Memory>,
    batches: Vec<Vec<Event>>,
    dead: bool,
    stop: Option<Duration>,
) -> Run {
    let (tx, rx) = channel(1024);
    let metrics = Arc::new(StageMetrics::default());
    let mut cx = SinkContext::new("objects", rx, metrics.clone());
    let (dead_tx, mut dead_rx) = channel(1024);
    if dead {
        cx.dead = Output::new(vec![dead_tx], metrics.clone(), OutputRole::Errors);
    } else {
        drop(dead_tx);
    }
    if let Some(after) = stop {
        let stop = cx.stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            stop.cancel();
        });
    }
    for batch in batches {
        tx.send(batch).await.unwrap();
    }
    drop(tx);
    let result = driver.run(&mut cx).await.map_err(|e| e.to_string());
    drop(cx);
    let mut got = Vec::new();
    while let Ok(Some(mut b)) = tokio::time::timeout(Duration::from_millis(1), dead_rx.recv()).await
    {
        got.extend(b.take());
    }
    Run {
        result,
        metrics,
        dead: got,
    }
}

fn outcomes(heard: &Heard) -> BTreeMap<u64, Outcome> {
    heard.0.lock().unwrap().clone()
}

fn all(range: std::ops::Range<u64>, o: Outcome) -> BTreeMap<u64, Outcome> {
    range.map(|i| (i, o)).collect()
}

/// One object per prefix; a large one goes up in parts and is whole once
/// complete; every event is confirmed delivered, once.
#[tokio::test(start_paused = true)]
async fn each_prefix_is_one_object_and_a_large_one_goes_up_in_parts() {
    let heard = Arc::new(Heard::default());
    let mut c = config();
    c.part_size_bytes = 64;
    let d = driver(memory(|_, _| None), c);
    let batches = vec![
        events(&heard, "a", 0..10),
        events(&heard, "b", 10..12),
        events(&heard, "a", 12..20),
    ];
    let r = run(&d, batches, false, None).await;
    assert_eq!(r.result, Ok(()));
    let objects = d.store().lines();
    assert_eq!(objects.len(), 2, "{objects:?}");
    let a: Vec<String> = (0..10).chain(12..20).map(|i| format!("a {i}")).collect();
    let b: Vec<String> = (10..12).map(|i| format!("b {i}")).collect();
    let mut got: Vec<Vec<String>> = objects.into_values().collect();
    got.sort();
    assert_eq!(got, vec![a, b]);
    assert!(
        d.store().calls(Call::Part) >= 2,
        "a's object went up in parts"
    );
    assert_eq!(d.store().calls(Call::Put), 1, "b's object in one put");
    assert_eq!(outcomes(&heard), all(0..20, Outcome::Delivered));
    let m = r.metrics.snapshot();
    assert_eq!((m.events_in, m.events_out, m.errored), (20, 20, 0));
}

/// Transient answers are retried and counted; a refusal fails the object:
/// its upload is aborted, its events errored, the stage names the call.
#[tokio::test(start_paused = true)]
async fn transient_failures_are_retried_and_a_refusal_aborts_the_object() {
    let heard = Arc::new(Heard::default());
    let d = driver(
        memory(|call, nth| (call == Call::Put && nth <= 2).then(|| Attempt::again("slow down"))),
        config(),
    );
    let r = run(&d, vec![events(&heard, "a", 0..5)], false, None).await;
    assert_eq!(r.result, Ok(()));
    assert_eq!(d.store().calls(Call::Put), 3);
    assert_eq!(r.metrics.snapshot().retried, 2);
    assert_eq!(outcomes(&heard), all(0..5, Outcome::Delivered));

    let heard = Arc::new(Heard::default());
    let mut c = config();
    c.part_size_bytes = 16;
    let d = driver(
        memory(|call, _| (call == Call::Complete).then(|| Attempt::Fail("AccessDenied".into()))),
        c,
    );
    let r = run(&d, vec![events(&heard, "a", 0..5)], false, None).await;
    let err = r.result.unwrap_err();
    assert!(
        err.contains("completing mem://bucket/a/0: AccessDenied"),
        "{err}"
    );
    assert_eq!(*d.store().aborted.lock().unwrap(), vec!["a/0".to_string()]);
    assert!(d.store().lines().is_empty());
    assert_eq!(outcomes(&heard), all(0..5, Outcome::Errored));
    assert_eq!(r.metrics.snapshot().errored, 5);
}

/// Retries run out: the object is given up with the attempts named, and
/// the other open objects' events are errored with it, not lost.
#[tokio::test(start_paused = true)]
async fn out_of_retries_gives_up_every_open_object() {
    let heard = Arc::new(Heard::default());
    let d = driver(
        memory(|call, _| (call == Call::Put).then(|| Attempt::again("503"))),
        config(),
    );
    let batches = vec![events(&heard, "a", 0..3), events(&heard, "b", 3..6)];
    let r = run(&d, batches, false, None).await;
    let err = r.result.unwrap_err();
    assert!(err.contains("503 (gave up after 4 attempts)"), "{err}");
    assert_eq!(outcomes(&heard), all(0..6, Outcome::Errored));
    assert_eq!(r.metrics.snapshot().errored, 6);
}

/// An event no object takes goes to `<id>.dead` with the reason; with
/// nothing reading it, it is acknowledged rejected and counted errored,
/// and the stage goes on. An event that only does not fit the open object
/// starts the next one.
#[tokio::test(start_paused = true)]
async fn misfits_go_to_the_dead_letters_or_the_next_object() {
    for dead in [true, false] {
        let heard = Arc::new(Heard::default());
        let d = driver(memory(|_, _| None), config());
        let mut batch = events(&heard, "a", 0..2);
        batch.extend(events(&heard, "never", 2..3));
        batch.extend(events(&heard, "next", 3..4));
        batch.extend(events(&heard, "next", 4..5));
        let r = run(&d, vec![batch], dead, None).await;
        assert_eq!(r.result, Ok(()));
        let mut want = all(0..5, Outcome::Delivered);
        if dead {
            assert_eq!(r.dead.len(), 1);
            let error = r.dead[0].as_fields().unwrap()["_error"]["message"].clone();
            assert_eq!(error, "a never event");
            want.remove(&2);
        } else {
            want.insert(2, Outcome::Rejected);
            assert_eq!(r.metrics.snapshot().errored, 1);
        }
        assert_eq!(outcomes(&heard), want);
        // "a" and the first "next" share no object with the second "next".
        let objects = d.store().lines();
        assert_eq!(objects.len(), 3, "{objects:?}");
    }
}

/// An object is finished when it is old enough, while the input stays
/// open; its events are confirmed then, not before.
#[tokio::test(start_paused = true)]
async fn an_object_old_enough_is_finished_while_the_input_is_open() {
    let heard = Arc::new(Heard::default());
    let d = Arc::new(driver(memory(|_, _| None), config()));
    let (tx, rx) = channel(64);
    let metrics = Arc::new(StageMetrics::default());
    let mut cx = SinkContext::new("objects", rx, metrics.clone());
    let running = {
        let d = d.clone();
        tokio::spawn(async move { d.run(&mut cx).await.map_err(|e| e.to_string()) })
    };
    tx.send(events(&heard, "a", 0..3)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(59)).await;
    assert!(outcomes(&heard).is_empty(), "not confirmed before its age");
    assert!(d.store().lines().is_empty());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(outcomes(&heard), all(0..3, Outcome::Delivered));
    assert_eq!(d.store().lines().len(), 1);
    drop(tx);
    assert_eq!(running.await.unwrap(), Ok(()));
}

/// A shutdown request finishes the open objects once no input is ready,
/// without waiting for the input to end (the sources wait for these
/// acknowledgements before they end).
#[tokio::test(start_paused = true)]
async fn a_shutdown_request_finishes_open_objects() {
    let heard = Arc::new(Heard::default());
    let d = Arc::new(driver(memory(|_, _| None), config()));
    let (tx, rx) = channel(64);
    let mut cx = SinkContext::new("objects", rx, Arc::new(StageMetrics::default()));
    let shutdown = cx.shutdown.clone();
    let running = {
        let d = d.clone();
        tokio::spawn(async move { d.run(&mut cx).await.map_err(|e| e.to_string()) })
    };
    tx.send(events(&heard, "a", 0..3)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(outcomes(&heard).is_empty());
    shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(outcomes(&heard), all(0..3, Outcome::Delivered));
    drop(tx);
    assert_eq!(running.await.unwrap(), Ok(()));
}

/// The drain deadline stops a store call that would be retried for ever:
/// the object's upload is aborted and its events errored, so a
/// checkpointing source sends them again.
#[tokio::test(start_paused = true)]
async fn the_drain_deadline_stops_retrying_and_errors_the_object() {
    let heard = Arc::new(Heard::default());
    let mut c = config();
    c.retry.max_attempts = None;
    c.part_size_bytes = 16;
    let d = driver(
        memory(|call, _| (call == Call::Complete).then(|| Attempt::again("503"))),
        c,
    );
    let r = run(
        &d,
        vec![events(&heard, "a", 0..5)],
        false,
        Some(Duration::from_secs(30)),
    )
    .await;
    let err = r.result.unwrap_err();
    assert!(err.contains("stopped at the drain deadline"), "{err}");
    assert_eq!(outcomes(&heard), all(0..5, Outcome::Errored));
    assert_eq!(d.store().aborted.lock().unwrap().len(), 1);
}

/// An object needing more parts than the store takes fails before the
/// extra part is sent, naming the options that size it.
#[tokio::test(start_paused = true)]
async fn more_parts_than_the_store_takes_fail_naming_the_options() {
    let heard = Arc::new(Heard::default());
    let mut c = config();
    c.part_size_bytes = 4;
    let d = driver(memory(|_, _| None), c);
    let r = run(&d, vec![events(&heard, "a", 0..10)], false, None).await;
    let err = r.result.unwrap_err();
    assert!(
        err.contains(
            "mem://bucket/a/0: more than 3 parts (raise part_size_bytes or lower max_object_bytes)"
        ),
        "{err}"
    );
    assert_eq!(d.store().calls(Call::Part), 3);
    assert_eq!(outcomes(&heard), all(0..10, Outcome::Errored));
}

/// A new prefix beyond `max_open_objects` finishes the oldest object
/// first; `max_object_events` finishes an object at its count.
#[tokio::test(start_paused = true)]
async fn the_open_limit_and_the_event_limit_finish_objects() {
    let heard = Arc::new(Heard::default());
    let mut c = config();
    c.max_open_objects = 1;
    c.max_object_events = Some(2);
    let d = driver(memory(|_, _| None), c);
    let batches = vec![
        events(&heard, "a", 0..1),
        events(&heard, "b", 1..2),
        events(&heard, "c", 2..7),
    ];
    let r = run(&d, batches, false, None).await;
    assert_eq!(r.result, Ok(()));
    let sizes: Vec<usize> = d.store().lines().values().map(Vec::len).collect();
    // a (1, pushed out by b), b (1, pushed out by c), c in 2 + 2 + 1.
    let mut sorted = sizes.clone();
    sorted.sort();
    assert_eq!(sorted, vec![1, 1, 1, 2, 2], "{sizes:?}");
    assert_eq!(outcomes(&heard), all(0..7, Outcome::Delivered));
}
