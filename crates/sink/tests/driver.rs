//! The driver against scripted services. What is under test is the
//! driver's bookkeeping, so the destination is a closure: which requests
//! it saw, and the outcome each event's acknowledgement reported. Time is
//! paused (tokio's test clock), so backoff and the drain deadline are
//! exact, not slept.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use logbus_plugin_api::{
    AckReceiver, BatchAck, Event, Meta, Outcome, Output, OutputRole, SinkContext, StageMetrics,
    async_trait, channel,
};
use logbus_sink::{
    Batch, BatchLimits, Driver, DriverConfig, ItemResult, JsonLines, OnRejected, Response,
    RetryPolicy, Service,
};

/// Outcome per event, by its number.
#[derive(Default)]
struct Heard(Mutex<BTreeMap<u64, Outcome>>);
impl AckReceiver for Heard {
    fn finished(&self, token: u64, outcome: Outcome) {
        assert!(self.0.lock().unwrap().insert(token, outcome).is_none());
    }
}

fn events(heard: &Arc<Heard>, range: std::ops::Range<u64>) -> Vec<Event> {
    range
        .map(|i| {
            let ack = BatchAck::new(heard.clone(), i);
            Event::raw(format!("{i}"), Meta::at("t", 0)).with_ack(ack.handle())
        })
        .collect()
}

type Answer = dyn Fn(&[u64], usize) -> Response + Send + Sync;

/// Answers each request with `answer(items, attempt number)`; records the
/// items of every request.
struct Scripted {
    answer: Box<Answer>,
    seen: Mutex<Vec<Vec<u64>>>,
    current: AtomicUsize,
    most: AtomicUsize,
    gate: Option<Arc<tokio::sync::Semaphore>>,
}

fn scripted(answer: impl Fn(&[u64], usize) -> Response + Send + Sync + 'static) -> Scripted {
    Scripted {
        answer: Box::new(answer),
        seen: Mutex::default(),
        current: AtomicUsize::new(0),
        most: AtomicUsize::new(0),
        gate: None,
    }
}

#[async_trait]
impl Service for Scripted {
    type Request = Vec<u64>;
    fn prepare(&self, batch: &Batch) -> Result<Vec<u64>, String> {
        Ok((0..batch.len())
            .map(|i| {
                let item = std::str::from_utf8(batch.item(i)).unwrap();
                item.trim_end().parse().unwrap()
            })
            .collect())
    }
    async fn send(&self, items: &Vec<u64>) -> Response {
        let now = self.current.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        if let Some(gate) = &self.gate {
            // One permit per request: a test lets requests through one by one.
            gate.acquire().await.unwrap().forget();
        }
        let attempt = {
            let mut seen = self.seen.lock().unwrap();
            seen.push(items.clone());
            seen.len()
        };
        self.current.fetch_sub(1, Ordering::SeqCst);
        (self.answer)(items, attempt)
    }
}

fn config(max_events: usize, in_flight: usize) -> DriverConfig {
    DriverConfig {
        limits: BatchLimits {
            max_events,
            max_bytes: 1 << 20,
            max_age: Duration::from_millis(50),
            max_partitions: 8,
        },
        retry: RetryPolicy {
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_secs(1),
            max_attempts: None,
            max_elapsed: None,
        },
        in_flight,
        on_rejected: OnRejected::Fail,
        destination: "the test service".into(),
    }
}

struct Run {
    result: Result<(), String>,
    metrics: Arc<StageMetrics>,
    heard: Arc<Heard>,
    dead: Vec<Event>,
}

/// Feeds `n` events in input batches of 3 through `driver`; `dead`
/// connects `<id>.dead` to a channel the test reads; `stop_after` cancels
/// the drain deadline token after that long.
async fn run(
    driver: Driver<Scripted>,
    n: u64,
    dead: bool,
    stop_after: Option<Duration>,
) -> (Run, Driver<Scripted>) {
    // Room for more than a batch: a sink holds its input batches until
    // their events are settled, so a channel smaller than `max_events`
    // would close every batch by age.
    run_in(driver, n, dead, stop_after, 256).await
}

/// [`run`] through an input channel of `capacity` events.
async fn run_in(
    driver: Driver<Scripted>,
    n: u64,
    dead: bool,
    stop_after: Option<Duration>,
    capacity: usize,
) -> (Run, Driver<Scripted>) {
    let heard = Arc::new(Heard::default());
    let (tx, rx) = channel(capacity);
    let metrics = Arc::new(StageMetrics::default());
    let mut cx = SinkContext::new("ship", rx, metrics.clone());
    let (dead_tx, mut dead_rx) = channel(1000);
    if dead {
        cx.dead = Output::new(vec![dead_tx], metrics.clone(), OutputRole::Errors);
    } else {
        drop(dead_tx);
    }
    if let Some(after) = stop_after {
        let stop = cx.stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            stop.cancel();
        });
    }
    let feeder = {
        let heard = heard.clone();
        tokio::spawn(async move {
            let mut i = 0;
            while i < n {
                let k = 3.min(n - i);
                if tx.send(events(&heard, i..i + k)).await.is_err() {
                    break;
                }
                i += k;
            }
        })
    };
    let result = driver.run(&mut cx).await.map_err(|e| e.to_string());
    drop(cx);
    feeder.abort();
    let _ = feeder.await;
    let dead = if dead {
        let mut got = Vec::new();
        while let Ok(Some(mut b)) =
            tokio::time::timeout(Duration::from_millis(1), dead_rx.recv()).await
        {
            got.extend(b.take());
        }
        got
    } else {
        Vec::new()
    };
    (
        Run {
            result,
            metrics,
            heard,
            dead,
        },
        driver,
    )
}

fn outcomes(heard: &Heard) -> BTreeMap<u64, Outcome> {
    heard.0.lock().unwrap().clone()
}

fn all(n: u64, o: Outcome) -> BTreeMap<u64, Outcome> {
    (0..n).map(|i| (i, o)).collect()
}

#[tokio::test(start_paused = true)]
async fn every_event_is_sent_once_in_batches_and_acknowledged_as_delivered() {
    let driver = Driver::new(
        scripted(|_, _| Response::Delivered),
        JsonLines,
        config(10, 1),
    );
    let (r, driver) = run(driver, 95, false, None).await;
    r.result.unwrap();
    let seen = driver.service().seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 10);
    assert!(seen.iter().all(|s| s.len() <= 10));
    assert_eq!(seen.concat(), (0..95).collect::<Vec<_>>());
    assert_eq!(outcomes(&r.heard), all(95, Outcome::Delivered));
    let m = r.metrics.snapshot();
    assert_eq!((m.events_in, m.events_out, m.errored), (95, 95, 0));
}

#[tokio::test(start_paused = true)]
async fn failures_are_retried_until_delivered() {
    // Every request fails twice, then goes through.
    let driver = Driver::new(
        scripted(|_, attempt| {
            if attempt % 3 == 0 {
                Response::Delivered
            } else {
                Response::Retry {
                    reason: "HTTP 503".into(),
                    retry_after: None,
                }
            }
        }),
        JsonLines,
        config(5, 1),
    );
    let (r, driver) = run(driver, 20, false, None).await;
    r.result.unwrap();
    let seen = driver.service().seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 12);
    let delivered: Vec<u64> = seen.iter().skip(2).step_by(3).flatten().copied().collect();
    assert_eq!(delivered, (0..20).collect::<Vec<_>>());
    assert_eq!(outcomes(&r.heard), all(20, Outcome::Delivered));
}

#[tokio::test(start_paused = true)]
async fn a_bulk_answer_retries_only_the_failed_items_and_dead_letters_the_refused() {
    // First answer per batch: even items stored, odd ones retried, item 3
    // refused; the retry of the odd ones is stored.
    let driver = Driver::new(
        scripted(|items, _| {
            if items.iter().all(|i| i % 2 == 1) {
                return Response::Delivered;
            }
            Response::Items(
                items
                    .iter()
                    .map(|i| match i {
                        3 => ItemResult::Rejected("mapping conflict".into()),
                        i if i % 2 == 0 => ItemResult::Delivered,
                        _ => ItemResult::Retry("es_rejected_execution".into()),
                    })
                    .collect(),
            )
        }),
        JsonLines,
        config(6, 1),
    );
    let (r, driver) = run(driver, 6, true, None).await;
    r.result.unwrap();
    let seen = driver.service().seen.lock().unwrap().clone();
    assert_eq!(seen, vec![vec![0, 1, 2, 3, 4, 5], vec![1, 5]]);
    // The refused event went to `ship.dead`, reason attached, and keeps its
    // acknowledgement: whatever reads the dead letters settles it (here
    // nothing does, so dropping it below reports it errored).
    assert_eq!(r.dead.len(), 1);
    let f = r.dead[0].as_fields().unwrap();
    assert_eq!(f["message"], "3");
    assert_eq!(f["_error"]["stage"], "ship");
    assert_eq!(f["_error"]["message"], "mapping conflict");
    let heard = outcomes(&r.heard);
    for i in [0, 1, 2, 4, 5] {
        assert_eq!(heard[&i], Outcome::Delivered, "event {i}");
    }
    drop(r.dead);
    assert_eq!(outcomes(&r.heard)[&3], Outcome::Errored);
    let m = r.metrics.snapshot();
    assert_eq!((m.events_out, m.routed), (5, 1));
}

#[tokio::test(start_paused = true)]
async fn refused_events_fail_the_stage_or_are_dropped_and_counted() {
    let refuse = |items: &[u64], _| {
        if items.contains(&4) {
            Response::Rejected {
                reason: "HTTP 400: bad".into(),
            }
        } else {
            Response::Delivered
        }
    };
    let (r, _) = run(
        Driver::new(scripted(refuse), JsonLines, config(3, 1)),
        9,
        false,
        None,
    )
    .await;
    let err = r.result.unwrap_err();
    assert!(
        err.contains("the test service did not take 3 events: HTTP 400: bad"),
        "{err}"
    );
    let heard = outcomes(&r.heard);
    assert_eq!(
        [heard[&3], heard[&4], heard[&5]],
        [Outcome::Errored; 3],
        "the source sends them again once the cause is fixed"
    );

    let mut c = config(3, 1);
    c.on_rejected = OnRejected::Drop;
    let (r, _) = run(Driver::new(scripted(refuse), JsonLines, c), 9, false, None).await;
    r.result.unwrap();
    let heard = outcomes(&r.heard);
    assert_eq!(heard.len(), 9);
    assert!(heard.iter().all(|(i, o)| *o
        == if (3..6).contains(i) {
            Outcome::Rejected
        } else {
            Outcome::Delivered
        }));
    let m = r.metrics.snapshot();
    assert_eq!((m.events_out, m.discarded), (6, 3));
}

#[tokio::test(start_paused = true)]
async fn out_of_retries_fails_with_the_reason_or_goes_to_the_dead_letters() {
    let down = |_: &[u64], _| Response::Retry {
        reason: "connection refused".into(),
        retry_after: None,
    };
    let mut c = config(10, 1);
    c.retry.max_attempts = Some(4);
    let (r, driver) = run(
        Driver::new(scripted(down), JsonLines, c.clone()),
        2,
        false,
        None,
    )
    .await;
    let err = r.result.unwrap_err();
    assert!(
        err.contains("gave up: 4 attempts") && err.contains("connection refused"),
        "{err}"
    );
    assert_eq!(driver.service().seen.lock().unwrap().len(), 4);
    assert_eq!(outcomes(&r.heard), all(2, Outcome::Errored));

    c.retry.max_attempts = None;
    c.retry.max_elapsed = Some(Duration::from_secs(5));
    let (r, _) = run(Driver::new(scripted(down), JsonLines, c), 2, true, None).await;
    r.result.unwrap();
    assert_eq!(r.dead.len(), 2);
    let why = r.dead[0].as_fields().unwrap()["_error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        why.starts_with("gave up: ") && why.contains("connection refused"),
        "{why}"
    );
}

#[tokio::test(start_paused = true)]
async fn retry_after_holds_the_next_attempt_back() {
    let started = tokio::time::Instant::now();
    let driver = Driver::new(
        scripted(|_, attempt| match attempt {
            1 => Response::Retry {
                reason: "HTTP 429".into(),
                retry_after: Some(Duration::from_millis(700)),
            },
            _ => Response::Delivered,
        }),
        JsonLines,
        config(10, 1),
    );
    let (r, _) = run(driver, 1, false, None).await;
    r.result.unwrap();
    // The input ended at once, so the batch went at once; then the 700 ms
    // the destination asked for, not the 10 ms backoff.
    assert!(started.elapsed() >= Duration::from_millis(700));
}

/// Two shapes at the deadline: every event taken is in a request being
/// retried (4 × 2 in flight), or most wait in batches not yet sent (one
/// request of 2 in flight, two more batches sealed behind it).
#[tokio::test(start_paused = true)]
async fn the_drain_deadline_stops_a_sink_that_would_retry_for_ever() {
    for (max_events, in_flight) in [(4, 2), (2, 1)] {
        the_drain_deadline_stops(max_events, in_flight).await;
    }
}

async fn the_drain_deadline_stops(max_events: usize, in_flight: usize) {
    let down = |_: &[u64], _| Response::Retry {
        reason: "HTTP 503".into(),
        retry_after: None,
    };
    let (r, _) = run(
        Driver::new(scripted(down), JsonLines, config(max_events, in_flight)),
        10,
        false,
        Some(Duration::from_secs(30)),
    )
    .await;
    let err = r.result.unwrap_err();
    assert!(err.contains("drain deadline passed with"), "{err}");
    // Every event the sink took is errored for its source; none is lost
    // without a word, none is called delivered.
    let heard = outcomes(&r.heard);
    assert!(heard.values().all(|o| *o == Outcome::Errored), "{heard:?}");
    let m = r.metrics.snapshot();
    assert_eq!(m.events_out, 0);
    assert_eq!(m.errored, m.events_in);
    let held: u64 = err
        .split("deadline passed with ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert_eq!(held, m.events_in);
}

#[tokio::test(start_paused = true)]
async fn requests_in_flight_never_exceed_the_limit_and_reach_it() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let mut service = scripted(|_, _| Response::Delivered);
    service.gate = Some(gate.clone());
    let driver = Arc::new(Driver::new(service, JsonLines, config(2, 3)));
    let running = {
        let driver = driver.clone();
        tokio::spawn(async move {
            let heard = Arc::new(Heard::default());
            let (tx, rx) = channel(64);
            let mut cx = SinkContext::new("ship", rx, Arc::new(StageMetrics::default()));
            for i in 0..10 {
                tx.send(events(&heard, i * 2..i * 2 + 2)).await.unwrap();
            }
            drop(tx);
            driver.run(&mut cx).await.unwrap();
            outcomes(&heard)
        })
    };
    // Wait (without sleeping: each step is one scheduler turn) until the
    // driver has as many requests going as it may.
    while driver.service().current.load(Ordering::SeqCst) < 3 {
        tokio::task::yield_now().await;
    }
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(driver.service().current.load(Ordering::SeqCst), 3);
    gate.add_permits(1000);
    let heard = running.await.unwrap();
    assert_eq!(heard, all(20, Outcome::Delivered));
    assert_eq!(driver.service().most.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn partitions_never_share_a_request() {
    let driver = Driver::new(
        scripted(|_, _| Response::Delivered),
        JsonLines,
        config(100, 1),
    )
    .partition_by(|e| {
        let n: u64 = std::str::from_utf8(e.as_raw().unwrap())
            .unwrap()
            .parse()
            .unwrap();
        (n % 3).to_string()
    });
    let (r, driver) = run(driver, 30, false, None).await;
    r.result.unwrap();
    let seen = driver.service().seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    for s in &seen {
        assert_eq!(s.len(), 10);
        assert!(s.iter().all(|i| i % 3 == s[0] % 3));
    }
}

#[tokio::test(start_paused = true)]
async fn a_batch_the_sink_holds_back_by_policy_is_discarded_not_retried_or_dead_lettered() {
    let driver = Driver::new(
        scripted(|items, _| {
            if items[0] == 0 {
                Response::Discarded {
                    reason: "rate limit".into(),
                }
            } else {
                Response::Delivered
            }
        }),
        JsonLines,
        config(3, 1),
    );
    let (r, driver) = run(driver, 6, true, None).await;
    r.result.unwrap();
    assert_eq!(driver.service().seen.lock().unwrap().len(), 2);
    assert!(r.dead.is_empty());
    let heard = outcomes(&r.heard);
    assert_eq!(
        [heard[&0], heard[&2], heard[&3]],
        [Outcome::Rejected, Outcome::Rejected, Outcome::Delivered]
    );
    let m = r.metrics.snapshot();
    assert_eq!((m.events_out, m.discarded, m.routed), (3, 3, 0));
}

/// A drain deadline that passes with nothing held is no failure: the sink
/// delivered everything it took (its input is still open).
#[tokio::test(start_paused = true)]
async fn a_drain_deadline_with_nothing_held_ends_cleanly() {
    let driver = Driver::new(
        scripted(|_, _| Response::Delivered),
        JsonLines,
        config(2, 1),
    );
    let heard = Arc::new(Heard::default());
    let (tx, rx) = channel(16);
    let metrics = Arc::new(StageMetrics::default());
    let mut cx = SinkContext::new("ship", rx, metrics.clone());
    tx.send(events(&heard, 0..4)).await.unwrap();
    let stop = cx.stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        stop.cancel();
    });
    driver.run(&mut cx).await.unwrap();
    drop(tx);
    assert_eq!(outcomes(&heard), all(4, Outcome::Delivered));
    assert_eq!(metrics.snapshot().errored, 0);
}

/// A batch may hold at most half of the input channel's events (a larger
/// one could only close by age, with the channel full behind it); a
/// smaller `max_events` stays as it is.
#[tokio::test(start_paused = true)]
async fn a_batch_holds_at_most_half_the_input_channel() {
    for (max_events, capacity, largest) in [(100, 8, 4), (10, 8, 4), (3, 8, 3)] {
        let driver = Driver::new(
            scripted(|_, _| Response::Delivered),
            JsonLines,
            config(max_events, 1),
        );
        let (r, driver) = run_in(driver, 30, false, None, capacity).await;
        r.result.unwrap();
        let seen = driver.service().seen.lock().unwrap().clone();
        assert_eq!(seen.concat(), (0..30).collect::<Vec<_>>());
        assert_eq!(
            seen.iter().map(Vec::len).max(),
            Some(largest),
            "max_events {max_events}, channel {capacity}"
        );
    }
}

/// Yields (each step one scheduler turn; the paused clock does not move
/// while this task is ready) until `cond` holds.
async fn until(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..100_000 {
        if cond() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("never: {what}");
}

/// The sink keeps each input batch, and with it the batch's room in the
/// channel, until every event taken from it is settled: an input batch
/// split across two requests is let go only when the second is done.
#[tokio::test(start_paused = true)]
async fn an_input_batch_holds_its_room_until_its_last_event_is_settled() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let mut service = scripted(|_, _| Response::Delivered);
    service.gate = Some(gate.clone());
    let driver = Arc::new(Driver::new(service, JsonLines, config(2, 1)));
    let heard = Arc::new(Heard::default());
    let (tx, rx) = channel(16);
    let channel_stats = tx.stats();
    let metrics = Arc::new(StageMetrics::default());
    let running = {
        let (driver, metrics) = (driver.clone(), metrics.clone());
        tokio::spawn(async move {
            let mut cx = SinkContext::new("ship", rx, metrics);
            driver.run(&mut cx).await.unwrap();
        })
    };
    // A = [0 1 2], B = [3 4]: requests [0 1], then [2 3] and [4] behind it.
    tx.send(events(&heard, 0..3)).await.unwrap();
    tx.send(events(&heard, 3..5)).await.unwrap();
    until("both input batches taken, one request out", || {
        metrics.snapshot().events_in == 5 && driver.service().current.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(channel_stats.occupancy(), 5, "both input batches held");
    // [0 1] done: A still has event 2 out, so A keeps all its room.
    gate.add_permits(1);
    until("the first request committed", || {
        metrics.snapshot().events_out == 2
    })
    .await;
    assert_eq!(
        channel_stats.occupancy(),
        5,
        "A let go before its last event"
    );
    gate.add_permits(1000);
    drop(tx);
    running.await.unwrap();
    assert_eq!(channel_stats.occupancy(), 0);
    assert_eq!(outcomes(&heard), all(5, Outcome::Delivered));
}

/// An answer with a result count other than the request's item count is
/// not trusted item by item: the whole request is tried again.
#[tokio::test(start_paused = true)]
async fn an_answer_for_the_wrong_number_of_items_retries_the_request() {
    let answer = |items: &[u64], attempt| {
        if attempt == 1 {
            Response::Items(vec![ItemResult::Delivered; items.len() - 1])
        } else {
            Response::Delivered
        }
    };
    let (r, driver) = run(
        Driver::new(scripted(answer), JsonLines, config(3, 1)),
        3,
        false,
        None,
    )
    .await;
    r.result.unwrap();
    let seen = driver.service().seen.lock().unwrap().clone();
    assert_eq!(seen, [vec![0, 1, 2], vec![0, 1, 2]]);
    assert_eq!(outcomes(&r.heard), all(3, Outcome::Delivered));
}

/// When the stage fails, the batch sealed behind the refused request is
/// never sent: its events are errored and counted with the refused ones.
#[tokio::test(start_paused = true)]
async fn a_failed_stage_counts_the_batches_it_never_sent_as_errored() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let mut service = scripted(|_, _| Response::Rejected {
        reason: "HTTP 400: bad".into(),
    });
    service.gate = Some(gate.clone());
    let driver = Arc::new(Driver::new(service, JsonLines, config(3, 1)));
    let heard = Arc::new(Heard::default());
    let (tx, rx) = channel(16);
    let metrics = Arc::new(StageMetrics::default());
    let running = {
        let (driver, metrics) = (driver.clone(), metrics.clone());
        tokio::spawn(async move {
            let mut cx = SinkContext::new("ship", rx, metrics);
            driver.run(&mut cx).await
        })
    };
    // [0 1 2] goes out and is held; [3 4 5] is sealed behind it.
    tx.send(events(&heard, 0..3)).await.unwrap();
    tx.send(events(&heard, 3..6)).await.unwrap();
    until("both batches taken, one request out", || {
        metrics.snapshot().events_in == 6 && driver.service().current.load(Ordering::SeqCst) == 1
    })
    .await;
    gate.add_permits(1000);
    running.await.unwrap().unwrap_err();
    assert_eq!(driver.service().seen.lock().unwrap().len(), 1);
    assert_eq!(outcomes(&heard), all(6, Outcome::Errored));
    let m = metrics.snapshot();
    assert_eq!((m.events_in, m.events_out, m.errored), (6, 0, 6));
}
