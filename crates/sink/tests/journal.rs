//! The driver with a batch journal, across a stop that leaves requests
//! unanswered (what a crash leaves) and a second run that reads the same
//! positions again with other batch limits. The destination is a closure
//! recording each request's items and name: what is under test is that
//! the second run sends the unanswered batches again as they were, under
//! the same names, and nothing of the answered ones.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use logbus_plugin_api::{
    AckReceiver, BatchAck, Event, Meta, Outcome, Position, SinkContext, StageMetrics, async_trait,
    channel,
};
use logbus_sink::{
    Batch, BatchId, BatchLimits, Driver, DriverConfig, JsonLines, OnRejected, Response,
    RetryPolicy, Service,
};

#[derive(Default)]
struct Heard(Mutex<BTreeMap<u64, Outcome>>);
impl AckReceiver for Heard {
    fn finished(&self, token: u64, outcome: Outcome) {
        self.0.lock().unwrap().insert(token, outcome);
    }
}

/// Each request's name and items; answers the first `answered` requests
/// and never the others.
struct Recording {
    answered: usize,
    seen: Mutex<Vec<(Option<BatchId>, Vec<u64>)>>,
    /// Each prepared batch's partition key.
    keys: Mutex<Vec<String>>,
}

#[async_trait]
impl Service for Recording {
    type Request = (Option<BatchId>, Vec<u64>);
    fn prepare(&self, batch: &Batch) -> Result<Self::Request, String> {
        let items = (0..batch.len())
            .map(|i| {
                std::str::from_utf8(batch.item(i))
                    .unwrap()
                    .trim_end()
                    .parse()
                    .unwrap()
            })
            .collect();
        self.keys.lock().unwrap().push(batch.key().to_string());
        Ok((batch.identity(), items))
    }
    async fn send(&self, request: &Self::Request) -> Response {
        let n = {
            let mut seen = self.seen.lock().unwrap();
            seen.push(request.clone());
            seen.len()
        };
        if n > self.answered {
            std::future::pending::<()>().await;
        }
        Response::Delivered
    }
}

fn config(max_events: usize) -> DriverConfig {
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
        in_flight: 2,
        on_rejected: OnRejected::Fail,
        destination: "the test service".into(),
    }
}

/// Runs a journalled driver over events `0..n` (position offset `10 × i`
/// of one stream), in input batches of 3, until the input ends and all
/// is settled or one simulated second passes.
async fn run(
    dir: &Path,
    max_events: usize,
    answered: usize,
    n: u64,
) -> (Vec<(Option<BatchId>, Vec<u64>)>, BTreeMap<u64, Outcome>) {
    let (seen, outcomes, _) = run_keyed(dir, max_events, answered, 0..n, None).await;
    (seen, outcomes)
}

type Seen = Vec<(Option<BatchId>, Vec<u64>)>;

/// A context for stage `id` whose input brings events `ids` (each at
/// offset `10 × i` of one stream, acknowledged to the returned record) in
/// batches of 3, and whose drain deadline passes after one (simulated)
/// second.
fn feeding(id: &str, ids: std::ops::Range<u64>) -> (SinkContext, Arc<Heard>) {
    let heard = Arc::new(Heard::default());
    let (tx, rx) = channel(256);
    let cx = SinkContext::new(id, rx, Arc::new(StageMetrics::default()));
    let stop = cx.stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        stop.cancel();
    });
    let events: Vec<Event> = ids
        .map(|i| {
            let mut meta = Meta::at("logs", 0);
            meta.position = Some(Position::new(1, i * 10));
            Event::raw(i.to_string(), meta).with_ack(BatchAck::new(heard.clone(), i).handle())
        })
        .collect();
    tokio::spawn(async move {
        let mut events = events.into_iter();
        loop {
            let chunk: Vec<Event> = events.by_ref().take(3).collect();
            if chunk.is_empty() || tx.send(chunk).await.is_err() {
                break;
            }
        }
    });
    (cx, heard)
}

/// [`run`] over the events of `ids`, partitioned by `partition` when
/// given; also returns each request's partition key.
async fn run_keyed(
    dir: &Path,
    max_events: usize,
    answered: usize,
    ids: std::ops::Range<u64>,
    partition: Option<&'static str>,
) -> (Seen, BTreeMap<u64, Outcome>, Vec<String>) {
    let (mut cx, heard) = feeding("ship", ids);
    let service = Recording {
        answered,
        seen: Mutex::default(),
        keys: Mutex::default(),
    };
    let mut driver =
        Driver::new(service, JsonLines, config(max_events)).journal_in(Some(dir.into()));
    if let Some(key) = partition {
        driver = driver.partition_by(move |_| key.to_string());
    }
    let _ = driver.run(&mut cx).await;
    let seen = driver.service().seen.lock().unwrap().clone();
    let keys = driver.service().keys.lock().unwrap().clone();
    let outcomes = heard.0.lock().unwrap().clone();
    (seen, outcomes, keys)
}

#[tokio::test(start_paused = true)]
async fn batches_unanswered_at_a_crash_are_sent_again_alike_and_answered_ones_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    // First run: two requests answered, the next ones never (a crash).
    let (first, outcomes) = run(dir.path(), 4, 2, 30).await;
    assert!(first.len() >= 4, "{first:?}");
    assert!(
        first
            .iter()
            .all(|(id, items)| id.is_some() && items.len() == 4)
    );
    let answered: BTreeSet<u64> = first[..2].iter().flat_map(|(_, i)| i.clone()).collect();
    let delivered: BTreeSet<u64> = outcomes
        .iter()
        .filter(|(_, o)| **o == Outcome::Delivered)
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(delivered, answered);

    // Second run, batches of 7 now, everything re-read and answered.
    let (second, outcomes) = run(dir.path(), 7, usize::MAX, 30).await;
    assert_eq!(outcomes.len(), 30);
    assert!(
        outcomes.values().all(|o| *o == Outcome::Delivered),
        "{outcomes:?}"
    );
    let resent: BTreeSet<u64> = second.iter().flat_map(|(_, i)| i.clone()).collect();
    assert!(resent.is_disjoint(&answered), "{second:?}");
    // The unanswered requests come again with the same items and names.
    for unanswered in &first[2..] {
        assert!(
            second.contains(unanswered),
            "{unanswered:?} not in {second:?}"
        );
    }
    // Every event reached the destination once.
    let mut count: BTreeMap<u64, usize> = BTreeMap::new();
    for (_, items) in first[..2].iter().chain(&second) {
        for i in items {
            *count.entry(*i).or_default() += 1;
        }
    }
    assert_eq!(count.len(), 30);
    assert!(count.values().all(|n| *n == 1), "{count:?}");
    // What the first run never sealed is batched by the new limits.
    assert!(
        second.iter().any(|(_, items)| items.len() == 7),
        "{second:?}"
    );
    // A batch made again goes as soon as its last event is back, not
    // when the input ends: before the batch holding the last event.
    let last = second.iter().position(|(_, i)| i.contains(&29)).unwrap();
    for unanswered in &first[2..] {
        let at = second.iter().position(|r| r == unanswered).unwrap();
        assert!(at < last, "{second:?}");
    }

    // A third run reads everything again: all of it was delivered, so
    // nothing is sent.
    let (third, outcomes) = run(dir.path(), 7, usize::MAX, 30).await;
    assert_eq!(outcomes.len(), 30);
    assert!(third.is_empty(), "{third:?}");
}

/// A journal that cannot be opened stops the stage before anything is
/// read, naming the file.
#[tokio::test]
async fn a_journal_that_cannot_be_opened_fails_the_stage_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    let (_tx, rx) = channel(16);
    let mut cx = SinkContext::new("ship", rx, Arc::new(StageMetrics::default()));
    let service = Recording {
        answered: 0,
        seen: Mutex::default(),
        keys: Mutex::default(),
    };
    let driver = Driver::new(service, JsonLines, config(4)).journal_in(Some(file.clone()));
    let err = driver.run(&mut cx).await.unwrap_err().to_string();
    assert!(
        err.contains("batch journal") && err.contains("not-a-dir"),
        "{err}"
    );
}

/// A restart that re-reads only part of an unanswered batch (the
/// source's checkpoint had passed the rest: the destination holds it)
/// sends that part under the batch's name, in the batch's partition, when
/// the input ends.
#[tokio::test(start_paused = true)]
async fn a_batch_read_again_in_part_goes_under_its_name_when_the_input_ends() {
    let dir = tempfile::tempdir().unwrap();
    let (first, _, keys) = run_keyed(dir.path(), 4, 1, 0..12, Some("k")).await;
    assert!(keys.iter().all(|k| k == "k"), "{keys:?}");
    let (id, items) = first[1].clone();
    assert_eq!(items, [4, 5, 6, 7]);
    let (second, outcomes, keys) = run_keyed(dir.path(), 4, usize::MAX, 6..8, Some("k")).await;
    assert_eq!(second, [(id, vec![6, 7])]);
    assert_eq!(keys, ["k"]);
    assert_eq!(outcomes.len(), 2);
    assert!(outcomes.values().all(|o| *o == Outcome::Delivered));
}

mod objects {
    //! The object driver with a journal: objects are keyed and journalled
    //! before they are stored; after a crash the re-read events make the
    //! journalled objects again under their keys (replacing them), and
    //! those of objects known stored are not written again.

    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use bytes::Bytes;
    use logbus_plugin_api::{Event, Outcome, async_trait};
    use logbus_sink::{
        Attempt, Misfit, ObjectConfig, ObjectDriver, ObjectFormat, ObjectStore, ObjectWriter,
        RetryPolicy,
    };

    struct Lines;
    struct LinesObject(Vec<u8>);
    impl ObjectFormat for Lines {
        fn open(&self) -> Result<Box<dyn ObjectWriter>, String> {
            Ok(Box::new(LinesObject(Vec::new())))
        }
    }
    impl ObjectWriter for LinesObject {
        fn write(&mut self, event: &Event) -> Result<(), Misfit> {
            self.0.extend_from_slice(event.as_raw().expect("raw"));
            self.0.push(b'\n');
            Ok(())
        }
        fn ready(&mut self) -> &mut Vec<u8> {
            &mut self.0
        }
        fn size(&self) -> u64 {
            self.0.len() as u64
        }
        fn finish(self: Box<Self>) -> Result<Vec<u8>, String> {
            Ok(self.0)
        }
    }

    /// Whole objects in a map that outlives a run; keys numbered across
    /// runs. The `hang_at`th put of a run stores its object and then never
    /// answers (the process dies before it hears the answer).
    #[derive(Clone, Default)]
    struct Shelf {
        objects: Arc<Mutex<BTreeMap<String, String>>>,
        next: Arc<AtomicUsize>,
    }

    struct Store {
        shelf: Shelf,
        puts: AtomicUsize,
        hang_at: Option<usize>,
    }

    #[async_trait]
    impl ObjectStore for Store {
        type Upload = ();
        type Part = ();
        const MAX_PARTS: usize = 1;

        fn key(&self, prefix: &str) -> String {
            format!(
                "{prefix}/{}",
                self.shelf.next.fetch_add(1, Ordering::SeqCst)
            )
        }
        async fn put(&self, key: &str, body: &Bytes) -> Attempt<()> {
            let n = self.puts.fetch_add(1, Ordering::SeqCst) + 1;
            self.shelf
                .objects
                .lock()
                .unwrap()
                .insert(key.to_string(), String::from_utf8(body.to_vec()).unwrap());
            if self.hang_at == Some(n) {
                std::future::pending::<()>().await;
            }
            Attempt::Done(())
        }
        async fn start(&self, _: &str) -> Attempt<()> {
            Attempt::Fail("whole objects only".into())
        }
        async fn put_part(&self, _: &str, _: &(), _: usize, _: &Bytes) -> Attempt<()> {
            Attempt::Fail("whole objects only".into())
        }
        async fn complete(&self, _: &str, _: &(), _: &[()]) -> Attempt<()> {
            Attempt::Fail("whole objects only".into())
        }
        async fn abort(&self, _: &str, _: &()) -> Result<(), String> {
            Ok(())
        }
    }

    /// Events `ids` (offset `10 × i` of one stream) into objects of
    /// `per_object` events; returns the puts made and each event's outcome.
    async fn run(
        dir: &Path,
        shelf: &Shelf,
        per_object: u64,
        hang_at: Option<usize>,
        ids: std::ops::Range<u64>,
    ) -> (usize, BTreeMap<u64, Outcome>) {
        let (mut cx, heard) = super::feeding("archive", ids);
        let config = ObjectConfig {
            max_object_bytes: 1 << 30,
            max_object_age: Duration::from_secs(10),
            max_object_events: Some(per_object),
            part_size_bytes: 1 << 30,
            max_open_objects: 4,
            retry: RetryPolicy {
                initial_backoff: Duration::from_millis(10),
                max_backoff: Duration::from_secs(1),
                max_attempts: None,
                max_elapsed: None,
            },
            request_timeout: Duration::from_secs(60),
            destination: "the shelf".into(),
        };
        let store = Store {
            shelf: shelf.clone(),
            puts: AtomicUsize::new(0),
            hang_at,
        };
        let driver = ObjectDriver::new(store, Box::new(Lines), |_| "p".to_string(), config)
            .journal_in(Some(dir.into()));
        let _ = driver.run(&mut cx).await;
        let puts = driver.store().puts.load(Ordering::SeqCst);
        let outcomes = heard.0.lock().unwrap().clone();
        (puts, outcomes)
    }

    #[tokio::test(start_paused = true)]
    async fn an_object_stored_as_the_process_died_is_made_again_under_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let shelf = Shelf::default();
        // The third object is stored, but its answer never comes.
        let (puts, outcomes) = run(dir.path(), &shelf, 4, Some(3), 0..12).await;
        assert_eq!(puts, 3);
        let delivered = outcomes
            .values()
            .filter(|o| **o == Outcome::Delivered)
            .count();
        assert_eq!(delivered, 8, "{outcomes:?}");
        let before = shelf.objects.lock().unwrap().clone();
        assert_eq!(before.len(), 3, "{before:?}");

        // Restart: everything read again, objects of 5 now, 3 new events.
        let (puts, outcomes) = run(dir.path(), &shelf, 5, None, 0..15).await;
        assert_eq!(outcomes.len(), 15);
        assert!(
            outcomes.values().all(|o| *o == Outcome::Delivered),
            "{outcomes:?}"
        );
        // The third object again under its key (as it was), one new one:
        // the two confirmed objects are not written again.
        assert_eq!(puts, 2);
        let after = shelf.objects.lock().unwrap().clone();
        assert_eq!(after.len(), 4, "{after:?}");
        for (key, body) in &before {
            assert_eq!(after.get(key), Some(body), "{key}");
        }
        let mut seen: Vec<u64> = after
            .values()
            .flat_map(|b| b.lines().map(|l| l.parse::<u64>().unwrap()))
            .collect();
        seen.sort();
        assert_eq!(
            seen,
            (0..15).collect::<Vec<_>>(),
            "each event in one object"
        );
        let unique: BTreeSet<u64> = seen.iter().copied().collect();
        assert_eq!(unique.len(), 15);

        // Once more from the start: the object made again was recorded
        // as stored too, so nothing is written.
        let (puts, outcomes) = run(dir.path(), &shelf, 5, None, 0..15).await;
        assert_eq!(puts, 0);
        assert_eq!(outcomes.len(), 15);
        assert!(outcomes.values().all(|o| *o == Outcome::Delivered));
        assert_eq!(*shelf.objects.lock().unwrap(), after);
    }
}
