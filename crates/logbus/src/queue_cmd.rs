//! `logbus queue inspect|check [--repair] DIR`: a durable queue's
//! directory seen from outside, so an operator never has to delete a queue
//! to get a pipeline going again.

use std::path::Path;
use std::process::ExitCode;

use logbus_queue::durable::inspect::{self, Report, StateReport};

fn render(report: &Report, verbose: bool) -> String {
    let mut out = String::new();
    let state = match &report.state {
        StateReport::Missing => "missing".to_string(),
        StateReport::Garbage => "damaged (no valid slot)".to_string(),
        StateReport::Valid {
            generation,
            acked,
            seqs,
        } => format!(
            "acknowledged up to segment {} offset {} (generation {generation}){}",
            acked.segment,
            acked.offset,
            seqs.map(|s| format!(
                "; record {} next, records before {} stored",
                s.acked, s.stored
            ))
            .unwrap_or_default()
        ),
    };
    out.push_str(&format!("queue {}\n", report.dir.display()));
    out.push_str(&format!("  state: {state}\n"));
    out.push_str(&format!(
        "  reader resumes at: segment {} offset {}\n",
        report.resume.segment, report.resume.offset
    ));
    match report.writer_end {
        Some(end) => out.push_str(&format!(
            "  writer end: segment {} offset {}\n",
            end.segment, end.offset
        )),
        None => out.push_str("  writer end: no segments\n"),
    }
    let bytes: u64 = report.segments.iter().map(|s| s.file_bytes).sum();
    out.push_str(&format!(
        "  segments: {}, {} bytes; unacknowledged records: {}\n  lost records (not reported before): {}\n",
        report.segments.len(),
        bytes,
        report.unacked_records(),
        report.lost_records
    ));
    out.push_str(&format!(
        "  {:>20} {:>12} {:>10} {:>10} {:>8}\n",
        "segment", "bytes", "records", "unacked", "damage"
    ));
    for (s, unacked) in report.segments.iter().zip(&report.unacked) {
        out.push_str(&format!(
            "  {:>20} {:>12} {:>10} {:>10} {:>8}\n",
            s.id,
            s.file_bytes,
            s.records,
            unacked,
            if s.is_clean() {
                "-".to_string()
            } else {
                format!("{}B", s.damaged_bytes)
            }
        ));
    }
    if verbose || !report.problems.is_empty() {
        for p in &report.problems {
            out.push_str(&format!("  problem: {p}\n"));
        }
    }
    out
}

/// Whether `dir` holds a queue itself: a state file or a segment.
fn holds_queue(dir: &Path) -> bool {
    dir.join("state").is_file()
        || logbus_queue::durable::list_segments(dir).is_ok_and(|ids| !ids.is_empty())
}

/// The queues to look at for `dir`: itself when it holds one; else the
/// queues directly below it (a stage's `queue.path` holds one queue per
/// stage). None at all is an error naming the directory.
fn queues(dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    if holds_queue(dir) {
        return Ok(vec![dir.to_path_buf()]);
    }
    let entries = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("`{}` is not a queue directory: {e}", dir.display()))?;
    let mut below: Vec<std::path::PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && holds_queue(p))
        .collect();
    below.sort();
    if below.is_empty() {
        anyhow::bail!(
            "no queue in `{}`: it has no state file and no segments, and no directory below it holds a queue",
            dir.display()
        );
    }
    crate::emit(&format!(
        "{} holds no queue itself; the {} queue(s) below it:\n",
        dir.display(),
        below.len()
    ));
    Ok(below)
}

/// `inspect`: always exits 0 when the directory can be read.
pub fn inspect(dir: &Path) -> anyhow::Result<ExitCode> {
    for queue in queues(dir)? {
        let report = inspect::check(&queue)?;
        crate::emit(&render(&report, false));
    }
    Ok(ExitCode::SUCCESS)
}

/// `check`: exit 0 clean, 1 damaged (after `--repair`: 0 once it is clean);
/// for a directory of stage queues, each is checked and the worst counts.
pub fn check(dir: &Path, repair: bool) -> anyhow::Result<ExitCode> {
    let mut worst = ExitCode::SUCCESS;
    for queue in queues(dir)? {
        if check_one(&queue, repair)? != ExitCode::SUCCESS {
            worst = ExitCode::from(1);
        }
    }
    Ok(worst)
}

fn check_one(dir: &Path, repair: bool) -> anyhow::Result<ExitCode> {
    let report = inspect::check(dir)?;
    crate::emit(&render(&report, true));
    if report.is_clean() {
        crate::emit("  ok: every record's checksum holds\n");
        return Ok(ExitCode::SUCCESS);
    }
    if !repair {
        crate::emit(
            "  damaged: run `logbus queue check --repair` to rewrite it (the queue must not be running)\n",
        );
        return Ok(ExitCode::from(1));
    }
    let repaired = inspect::repair(dir)?;
    for note in &repaired.notes {
        crate::emit(&format!("  repair: {note}\n"));
    }
    crate::emit(&format!(
        "  repaired: {} segments rewritten, {} renumbered, {} acknowledged segments removed, {} records kept, {} records lost, {} damaged bytes dropped{}\n",
        repaired.segments_rewritten,
        repaired.segments_renumbered,
        repaired.segments_removed,
        repaired.records_kept,
        repaired.records_lost,
        repaired.bytes_dropped,
        if repaired.state_rewritten {
            ", state rewritten"
        } else {
            ""
        }
    ));
    let after = inspect::check(dir)?;
    if after.is_clean() {
        crate::emit("  ok: the queue checks clean now\n");
        Ok(ExitCode::SUCCESS)
    } else {
        crate::emit(&render(&after, true));
        Ok(ExitCode::from(1))
    }
}
