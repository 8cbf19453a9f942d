//! The templated, rotating file sink on a real filesystem: events split by
//! field into directories, size rotation keeping N files, a bound on open
//! files, and compressed rotated files that still decode.

#![cfg(feature = "sink-file")]

use std::io::Read;
use std::path::Path;

use logbus_compress::{Compression, ReadCompression};
use logbus_io::file_set::{FileSet, FileSetOptions, PathTemplate};
use logbus_plugin_api::{Event, Fields, Meta};

fn event(service: &str, n: usize) -> Event {
    Event::fields(
        serde_json::from_value::<Fields>(serde_json::json!({"service": service, "n": n})).unwrap(),
        Meta::at("t", 1_795_000_000_000_000_000),
    )
}

/// The sink's defaults, with the folders a template names made.
fn options() -> FileSetOptions {
    FileSetOptions {
        create_dirs: true,
        ..FileSetOptions::default()
    }
}

fn numbers(path: &Path, compression: ReadCompression) -> Vec<u64> {
    let mut text = String::new();
    logbus_compress::open(std::fs::File::open(path).unwrap(), compression)
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    text.lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["n"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

#[test]
fn events_go_to_the_file_their_fields_name_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let t = PathTemplate::parse("logs/{{service}}/%Y.log").unwrap();
    let mut set = FileSet::new(dir.path().to_owned(), t, options());
    let events: Vec<Event> = (0..10)
        .map(|i| event(if i % 3 == 0 { "api" } else { "db" }, i))
        .collect();
    set.write(&events).unwrap();
    set.close().unwrap();
    let year = chrono::DateTime::from_timestamp_nanos(1_795_000_000_000_000_000)
        .format("%Y")
        .to_string();
    let api = dir.path().join(format!("logs/api/{year}.log"));
    let db = dir.path().join(format!("logs/db/{year}.log"));
    assert_eq!(numbers(&api, ReadCompression::None), [0, 3, 6, 9]);
    assert_eq!(numbers(&db, ReadCompression::None), [1, 2, 4, 5, 7, 8]);
}

#[test]
fn size_rotation_keeps_the_newest_files_and_loses_nothing_it_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let t = PathTemplate::parse("app.log").unwrap();
    let mut set = FileSet::new(
        dir.path().to_owned(),
        t,
        FileSetOptions {
            rotate_bytes: Some(200),
            rotate_keep: 2,
            ..options()
        },
    );
    for n in 0..60 {
        set.write(&[event("api", n)]).unwrap();
    }
    set.close().unwrap();
    let p = |s: &str| dir.path().join(s);
    assert!(p("app.log.1").exists() && p("app.log.2").exists());
    assert!(!p("app.log.3").exists());
    assert!(set.rotations >= 3);
    // What is kept is a contiguous run of the newest events, in order.
    let mut kept = Vec::new();
    for name in ["app.log.2", "app.log.1", "app.log"] {
        if p(name).exists() {
            kept.extend(numbers(&p(name), ReadCompression::None));
        }
    }
    let first = kept[0];
    assert_eq!(kept, (first..60).collect::<Vec<_>>());
    for name in ["app.log.1", "app.log.2"] {
        assert!(std::fs::metadata(p(name)).unwrap().len() >= 200);
    }
}

#[test]
fn open_files_are_bounded_and_reopened_files_are_appended_to() {
    let dir = tempfile::tempdir().unwrap();
    let t = PathTemplate::parse("{{service}}.log").unwrap();
    let mut set = FileSet::new(
        dir.path().to_owned(),
        t,
        FileSetOptions {
            max_open_files: 2,
            ..options()
        },
    );
    for round in 0..3 {
        for (i, s) in ["a", "b", "c", "d", "e"].iter().enumerate() {
            set.write(&[event(s, round * 10 + i)]).unwrap();
            assert_eq!(set.open_files(), (round * 5 + i + 1).min(2));
        }
    }
    set.close().unwrap();
    assert_eq!(
        numbers(&dir.path().join("c.log"), ReadCompression::None),
        [2, 12, 22]
    );
}

#[test]
fn compressed_files_rotate_into_whole_streams() {
    let dir = tempfile::tempdir().unwrap();
    let t = PathTemplate::parse("{{service}}.log.gz").unwrap();
    let mut set = FileSet::new(
        dir.path().to_owned(),
        t,
        FileSetOptions {
            compression: Compression::Gzip,
            rotate_bytes: Some(300),
            rotate_keep: 10,
            ..options()
        },
    );
    for n in 0..100 {
        set.write(&[event("api", n)]).unwrap();
    }
    set.close().unwrap();
    let mut all = Vec::new();
    for k in (1..=10).rev() {
        let p = dir.path().join(format!("api.log.gz.{k}"));
        if p.exists() {
            all.extend(numbers(&p, ReadCompression::Gzip));
        }
    }
    all.extend(numbers(
        &dir.path().join("api.log.gz"),
        ReadCompression::Gzip,
    ));
    assert_eq!(all, (0..100).collect::<Vec<_>>());
}
