//! The tailer against real files, stepped by hand (scan, read, close) with
//! the clock passed in: appends, late files, rotation by rename and by
//! copy-truncate, deletion, restarts from saved positions, a reused inode,
//! long lines and multi-line events.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use logbus_tail::checkpoint::{Checkpoints, StateFile};
use logbus_tail::multiline::{MultilineConfig, Rule};
use logbus_tail::tailer::{ReadFrom, TailConfig, Tailer, fingerprint_of};

fn config(dir: &Path, read_from: ReadFrom) -> TailConfig {
    TailConfig {
        include: vec![glob::Pattern::new(&format!("{}/*.log", dir.display())).unwrap()],
        exclude: vec![glob::Pattern::new(&format!("{}/skip*.log", dir.display())).unwrap()],
        read_from,
        fingerprint_bytes: 16,
        max_line_bytes: 64,
        rotate_wait: Duration::from_secs(5),
        multiline: None,
        read_chunk: 1 << 16,
    }
}

fn append(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

fn step(t: &mut Tailer, now: Instant) -> Vec<String> {
    t.scan(now);
    let mut out = Vec::new();
    loop {
        let lines = t.read(now);
        if lines.is_empty() {
            break;
        }
        out.extend(
            lines
                .into_iter()
                .map(|l| String::from_utf8(l.bytes).unwrap()),
        );
    }
    out
}

#[test]
fn appended_lines_are_read_once_and_a_partial_line_waits_for_its_newline() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.log");
    append(&a, "one\ntwo\nhal");
    append(&dir.path().join("skip-me.log"), "excluded\n");
    let mut t = Tailer::new(
        config(dir.path(), ReadFrom::Beginning),
        Checkpoints::default(),
    );
    let now = Instant::now();
    assert_eq!(step(&mut t, now), ["one", "two"]);
    assert_eq!(step(&mut t, now), Vec::<String>::new());
    append(&a, "f\nthree\n");
    assert_eq!(step(&mut t, now), ["half", "three"]);
    assert_eq!(t.followed(), 1);
}

#[test]
fn read_from_end_skips_what_was_there_but_not_files_that_appear_later() {
    let dir = tempfile::tempdir().unwrap();
    append(&dir.path().join("old.log"), "history\n");
    let mut t = Tailer::new(config(dir.path(), ReadFrom::End), Checkpoints::default());
    let now = Instant::now();
    assert!(step(&mut t, now).is_empty());
    append(&dir.path().join("old.log"), "fresh\n");
    append(&dir.path().join("new.log"), "first\nsecond\n");
    let mut got = step(&mut t, now);
    got.sort();
    assert_eq!(got, ["first", "fresh", "second"]);
}

#[test]
fn rotation_by_rename_reads_the_old_file_to_its_end_then_the_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("app.log");
    append(&a, "0\n1\n");
    let mut t = Tailer::new(
        config(dir.path(), ReadFrom::Beginning),
        Checkpoints::default(),
    );
    let t0 = Instant::now();
    assert_eq!(step(&mut t, t0), ["0", "1"]);
    // logrotate: rename, the writer still appends to the old file for a
    // moment, then a new file takes the name.
    std::fs::rename(&a, dir.path().join("app.log.1")).unwrap();
    append(&dir.path().join("app.log.1"), "2\n");
    append(&a, "3\n4\n");
    let mut got = step(&mut t, t0);
    got.sort();
    assert_eq!(got, ["2", "3", "4"]);
    assert_eq!(t.followed(), 2);
    // The old file is dropped once quiet for rotate_wait.
    assert!(t.close_finished(t0 + Duration::from_secs(4)).is_empty());
    assert_eq!(t.followed(), 2);
    t.close_finished(t0 + Duration::from_secs(5));
    assert_eq!(t.followed(), 1);
    assert_eq!(t.stats.files_closed, 1);
    append(&a, "5\n");
    assert_eq!(step(&mut t, t0), ["5"]);
}

#[test]
fn copy_truncate_and_truncation_start_the_file_over() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("app.log");
    append(&a, "aaaa\nbbbb\ncccc\n");
    let mut t = Tailer::new(
        config(dir.path(), ReadFrom::Beginning),
        Checkpoints::default(),
    );
    let now = Instant::now();
    assert_eq!(step(&mut t, now).len(), 3);
    // copytruncate: copy away, truncate in place, writing goes on.
    std::fs::copy(&a, dir.path().join("app.log.1.gz-not-matched")).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&a)
        .unwrap()
        .set_len(0)
        .unwrap();
    append(&a, "new\n");
    assert_eq!(step(&mut t, now), ["new"]);
    assert_eq!(t.stats.truncations, 1);
}

#[test]
fn a_file_rewritten_in_place_to_the_same_length_or_longer_is_noticed_by_its_fingerprint() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("app.log");
    append(&a, "first version of the file\n");
    let mut t = Tailer::new(
        config(dir.path(), ReadFrom::Beginning),
        Checkpoints::default(),
    );
    let now = Instant::now();
    assert_eq!(step(&mut t, now), ["first version of the file"]);
    t.scan(now); // takes the fingerprint
    // Rewritten (same inode) with different, longer content.
    std::fs::write(&a, "SECOND version, longer than the first\n").unwrap();
    assert_eq!(step(&mut t, now), ["SECOND version, longer than the first"]);
    assert_eq!(t.stats.replaced, 1);
}

#[test]
fn a_deleted_file_is_read_to_its_end_then_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("app.log");
    append(&a, "x\n");
    let mut t = Tailer::new(
        config(dir.path(), ReadFrom::Beginning),
        Checkpoints::default(),
    );
    let t0 = Instant::now();
    assert_eq!(step(&mut t, t0), ["x"]);
    let mut open = std::fs::OpenOptions::new().append(true).open(&a).unwrap();
    std::fs::remove_file(&a).unwrap();
    open.write_all(b"after delete\nunterminated").unwrap();
    assert_eq!(step(&mut t, t0), ["after delete"]);
    // The unterminated last line comes out when the file is let go.
    let last = t.close_finished(t0 + Duration::from_secs(5));
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].bytes, b"unterminated");
    assert_eq!(t.followed(), 0);
}

#[test]
fn a_restart_from_saved_positions_neither_rereads_nor_skips() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let a = logs.join("a.log");
    append(&a, "1\n2\n3");
    let mut state = StateFile::new(dir.path(), "src");
    {
        let (cps, note) = state.load();
        assert!(note.is_none() && cps.is_empty());
        let mut t = Tailer::new(config(&logs, ReadFrom::Beginning), cps);
        assert_eq!(step(&mut t, Instant::now()), ["1", "2"]);
        state.save(t.positions()).unwrap();
    }
    append(&a, "\n4\n");
    let (cps, _) = StateFile::new(dir.path(), "src").load();
    assert_eq!(cps.len(), 1);
    // read_from: end does not apply to a file with a saved position.
    let mut t = Tailer::new(config(&logs, ReadFrom::End), cps);
    assert_eq!(step(&mut t, Instant::now()), ["3", "4"]);
    assert_eq!(t.stats.resumed, 1);
}

#[test]
fn a_saved_position_for_a_reused_inode_is_not_applied_to_the_new_file() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.log");
    append(&a, "a brand new file here\nline two\n");
    let meta = std::fs::metadata(&a).unwrap();
    // A position saved for an earlier file that had this inode.
    std::fs::write(
        dir.path().join("src.tail.json"),
        serde_json::json!({
            "version": 1,
            "files": [{
                "dev": meta.dev(), "ino": meta.ino(),
                "fingerprint": fingerprint_of(b"some other conte"),
                "fingerprint_len": 16, "offset": 22, "path": "old.log"
            }]
        })
        .to_string(),
    )
    .unwrap();
    let (cps, _) = StateFile::new(dir.path(), "src").load();
    let mut t = Tailer::new(config(dir.path(), ReadFrom::End), cps);
    assert_eq!(
        step(&mut t, Instant::now()),
        ["a brand new file here", "line two"]
    );
    // With the right fingerprint the position holds.
    std::fs::write(
        dir.path().join("src.tail.json"),
        serde_json::json!({
            "version": 1,
            "files": [{
                "dev": meta.dev(), "ino": meta.ino(),
                "fingerprint": fingerprint_of(b"a brand new file"),
                "fingerprint_len": 16, "offset": 22, "path": "a.log"
            }]
        })
        .to_string(),
    )
    .unwrap();
    let (cps, _) = StateFile::new(dir.path(), "src").load();
    let mut t = Tailer::new(config(dir.path(), ReadFrom::Beginning), cps);
    assert_eq!(step(&mut t, Instant::now()), ["line two"]);
}

#[test]
fn a_damaged_state_file_is_reported_and_ignored() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("src.tail.json"), "{ not json").unwrap();
    let (cps, note) = StateFile::new(dir.path(), "src").load();
    assert!(cps.is_empty());
    assert!(note.unwrap().contains("damaged"));
}

#[test]
fn long_lines_are_cut_into_pieces() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.log");
    let long = "x".repeat(150);
    let exact = "y".repeat(64);
    append(&a, &format!("{long}\n{exact}\nshort\n"));
    let mut t = Tailer::new(
        config(dir.path(), ReadFrom::Beginning),
        Checkpoints::default(),
    );
    let got = step(&mut t, Instant::now());
    // A line of exactly the limit is one event.
    assert_eq!(
        got.iter().map(String::len).collect::<Vec<_>>(),
        [64, 64, 22, 64, 5]
    );
    assert_eq!(got.concat(), format!("{long}{exact}short"));
    assert_eq!(t.stats.lines_cut, 2);
    // A long line still without its newline is cut as it comes.
    append(&a, &"z".repeat(130));
    assert_eq!(
        step(&mut t, Instant::now())
            .iter()
            .map(String::len)
            .collect::<Vec<_>>(),
        [64, 64]
    );
    assert_eq!(t.stats.lines_cut, 4);
    append(&a, "\n");
    assert_eq!(step(&mut t, Instant::now()), ["zz"]);
}

#[test]
fn multi_line_events_are_joined_and_not_checkpointed_until_emitted() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.log");
    let mut cfg = config(dir.path(), ReadFrom::Beginning);
    cfg.max_line_bytes = 4096;
    cfg.multiline = Some(MultilineConfig {
        rule: Rule::Start(regex::bytes::Regex::new(r"^\[").unwrap()),
        timeout: Duration::from_secs(1),
        max_lines: 100,
        max_bytes: 4096,
    });
    append(&a, "[1] boom\n  at a\n  at b\n[2] next\n");
    let mut t = Tailer::new(cfg, Checkpoints::default());
    let t0 = Instant::now();
    assert_eq!(step(&mut t, t0), ["[1] boom\n  at a\n  at b"]);
    // "[2] next" waits for its continuation: the saved position stays
    // before it, so a restart re-reads it rather than losing it.
    let pos = &t.positions()[0];
    assert_eq!(pos.offset, "[1] boom\n  at a\n  at b\n".len() as u64);
    // The timeout emits it.
    t.scan(t0);
    let late = t.read(t0 + Duration::from_secs(1));
    assert_eq!(late.len(), 1);
    assert_eq!(late[0].bytes, b"[2] next");
    assert_eq!(
        t.positions()[0].offset,
        std::fs::metadata(&a).unwrap().len()
    );
    // At shutdown a waiting event comes out without its timeout.
    append(&a, "[3] last\n");
    assert!(step(&mut t, t0 + Duration::from_secs(1)).is_empty());
    let flushed = t.flush_joined();
    assert_eq!(flushed.len(), 1);
    assert_eq!(flushed[0].bytes, b"[3] last");
    assert!(t.flush_joined().is_empty());
}

/// The fingerprint describes bytes already read: none before the first
/// read, the first `fingerprint_bytes` after it (a short file's whole
/// text, growing with it).
#[test]
fn a_file_is_fingerprinted_only_once_its_first_bytes_were_read() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.log");
    append(&a, "0123456789abcdefXYZ\n");
    let b = dir.path().join("b.log");
    append(&b, "short\n");
    let mut t = Tailer::new(
        config(dir.path(), ReadFrom::Beginning),
        Checkpoints::default(),
    );
    let now = Instant::now();
    t.scan(now);
    assert!(t.positions().iter().all(|p| p.fingerprint_len == 0));
    assert_eq!(step(&mut t, now), ["0123456789abcdefXYZ", "short"]);
    t.scan(now);
    let fingerprints: Vec<_> = t
        .positions()
        .iter()
        .map(|p| {
            (
                p.path.rsplit('/').next().unwrap().to_string(),
                p.fingerprint_len,
                p.fingerprint,
            )
        })
        .collect();
    let mut expected = vec![
        ("a.log".to_string(), 16, fingerprint_of(b"0123456789abcdef")),
        ("b.log".to_string(), 6, fingerprint_of(b"short\n")),
    ];
    let mut got = fingerprints.clone();
    got.sort();
    expected.sort();
    assert_eq!(got, expected);
    append(&b, "longer now\n");
    assert_eq!(step(&mut t, now), ["longer now"]);
    t.scan(now);
    let b_now = t
        .positions()
        .into_iter()
        .find(|p| p.path.ends_with("b.log"))
        .unwrap();
    assert_eq!(
        (b_now.fingerprint_len, b_now.fingerprint),
        (16, fingerprint_of(b"short\nlonger now"))
    );
    assert_eq!(t.stats.files_opened, 2);
    assert_eq!(t.stats.replaced, 0);
}

/// `rotate_wait` counts from the last time a rotated-away file gave data,
/// not from the rotation nor from the last look at it.
#[test]
fn a_rotated_file_is_kept_until_quiet_for_rotate_wait_since_its_last_data() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("app.log");
    append(&a, "0\n");
    let mut t = Tailer::new(
        config(dir.path(), ReadFrom::Beginning),
        Checkpoints::default(),
    );
    let t0 = Instant::now();
    let s = Duration::from_secs;
    assert_eq!(step(&mut t, t0), ["0"]);
    std::fs::rename(&a, dir.path().join("app.log.1")).unwrap();
    assert!(step(&mut t, t0).is_empty());
    // The writer still appends to the rotated file 3 s later.
    append(&dir.path().join("app.log.1"), "late\n");
    assert_eq!(step(&mut t, t0 + s(3)), ["late"]);
    // Looked at again with nothing new: not data.
    assert!(step(&mut t, t0 + s(4)).is_empty());
    assert!(t.close_finished(t0 + s(7)).is_empty());
    assert_eq!(t.followed(), 1, "closed 4 s after its last data");
    t.close_finished(t0 + s(8));
    assert_eq!(t.followed(), 0);
}

/// Every line read, with the file identity and offset it had (`step`
/// keeps only the text).
fn step_placed(t: &mut Tailer, now: Instant) -> Vec<(String, u64, u64)> {
    t.scan(now);
    let mut out = Vec::new();
    loop {
        let lines = t.read(now);
        if lines.is_empty() {
            break;
        }
        out.extend(
            lines
                .into_iter()
                .map(|l| (String::from_utf8(l.bytes).unwrap(), l.stream, l.offset)),
        );
    }
    out
}

/// An event's position is its first byte's offset in its file and a name
/// for the file that a restart gives it again (lines early in the file,
/// before `fingerprint_bytes` exist, included), while the same inode
/// holding other text after a copy-truncate gets another name.
#[test]
fn positions_name_each_line_alike_when_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let a = logs.join("a.log");
    // fingerprint_bytes is 16: "1\n" and "22\n" end before it.
    append(&a, "1\n22\n");
    let mut t = Tailer::new(config(&logs, ReadFrom::Beginning), Checkpoints::default());
    let first = step_placed(&mut t, Instant::now());
    append(&a, "333\n4444444444444\n55555\n");
    let mut all = first.clone();
    all.extend(step_placed(&mut t, Instant::now()));
    let texts: Vec<&str> = all.iter().map(|(l, ..)| l.as_str()).collect();
    assert_eq!(texts, ["1", "22", "333", "4444444444444", "55555"]);
    let offsets: Vec<u64> = all.iter().map(|(_, _, o)| *o).collect();
    assert_eq!(offsets, [0, 2, 5, 9, 23]);
    // Past the fingerprint's bytes every line names the file alike, and
    // the file's first bytes are read once more for all of them (the
    // three lines before read them each).
    assert_eq!(all[3].1, all[4].1);
    assert_eq!(t.stats.head_reads, 4);
    append(&a, &"more\n".repeat(100));
    let more = step_placed(&mut t, Instant::now());
    assert_eq!(more.len(), 100);
    assert_eq!(t.stats.head_reads, 4);
    assert!(more.iter().all(|(_, stream, _)| *stream == all[4].1));
    all.extend(more);
    // A fresh tailer (a restart that lost its state) reads the same
    // lines with the same names.
    let mut again = Tailer::new(config(&logs, ReadFrom::Beginning), Checkpoints::default());
    assert_eq!(step_placed(&mut again, Instant::now()), all);
    // Resumed from a saved position: the lines after it, named alike.
    let mut state = StateFile::new(dir.path(), "src");
    let mut partway = Tailer::new(config(&logs, ReadFrom::Beginning), Checkpoints::default());
    partway.scan(Instant::now());
    state.save(partway.positions()).unwrap();
    drop(partway);
    let mut saved = Tailer::new(config(&logs, ReadFrom::Beginning), Checkpoints::default());
    assert_eq!(step_placed(&mut saved, Instant::now()), all);
    state.save(saved.positions()).unwrap();
    append(&a, "666\n");
    let (cps, _) = StateFile::new(dir.path(), "src").load();
    let mut resumed = Tailer::new(config(&logs, ReadFrom::Beginning), cps);
    let after = step_placed(&mut resumed, Instant::now());
    assert_eq!(after, [("666".to_string(), all[4].1, 29 + 500)]);
    // Copy-truncate, then other text: same inode, another name.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&a)
        .unwrap()
        .set_len(0)
        .unwrap();
    append(&a, "other text, long enough\n");
    let rewritten = step_placed(&mut resumed, Instant::now());
    assert_eq!(rewritten.len(), 1);
    assert_eq!(rewritten[0].2, 0);
    assert_ne!(rewritten[0].1, all[0].1);
    assert_ne!(rewritten[0].1, all[4].1);
}

/// A joined event starts where its first line does; a line cut into
/// pieces gives each piece its own offset.
#[test]
fn joined_events_and_cut_pieces_have_their_own_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.log");
    let mut cfg = config(dir.path(), ReadFrom::Beginning);
    cfg.max_line_bytes = 4096;
    cfg.multiline = Some(MultilineConfig {
        rule: Rule::Start(regex::bytes::Regex::new(r"^\[").unwrap()),
        timeout: Duration::from_secs(1),
        max_lines: 100,
        max_bytes: 4096,
    });
    append(&a, "[1] boom\n  at a\n[2] next\n  at b\n[3] x\n");
    let mut t = Tailer::new(cfg, Checkpoints::default());
    let t0 = Instant::now();
    let joined = step_placed(&mut t, t0);
    let offsets: Vec<(&str, u64)> = joined.iter().map(|(l, _, o)| (l.as_str(), *o)).collect();
    assert_eq!(offsets, [("[1] boom\n  at a", 0), ("[2] next\n  at b", 16)]);
    t.scan(t0);
    let late = t.read(t0 + Duration::from_secs(1));
    assert_eq!(
        (late[0].bytes.as_slice(), late[0].offset),
        (&b"[3] x"[..], 32)
    );

    let b = dir.path().join("b.log");
    append(&b, &format!("{}\nend\n", "x".repeat(150)));
    let mut t = Tailer::new(
        config(dir.path(), ReadFrom::Beginning),
        Checkpoints::default(),
    );
    let pieces = step_placed(&mut t, t0);
    let offsets: Vec<(usize, u64)> = pieces
        .iter()
        .filter(|(l, ..)| l.starts_with('x') || l == "end")
        .map(|(l, _, o)| (l.len(), *o))
        .collect();
    // max_line_bytes is 64.
    assert_eq!(offsets, [(64, 0), (64, 64), (22, 128), (3, 151)]);
}
