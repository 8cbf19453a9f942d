//! `cargo xtask load files`: LogBus and peers each read the same input file
//! and write an output file, with nothing of the harness between them and
//! the data.
//!
//! Why a third comparison beside the profile and `flood`: those two feed
//! and collect every line through the harness's own threads, which on a
//! two-core machine take a large share of the cores and bound a fast target
//! (LogBus waited on them at 0.68 of a core). Here a target reads a file
//! and writes one, as it would tail a log on a host; the harness only
//! watches the output file grow, counting lines with a vectorised search
//! every few milliseconds. The clock runs from the start of the process to
//! the last line written, start-up included. Targets alternate within each
//! repetition (the order rotated), as in `flood`. Peak RSS is each
//! process's own high-water mark (`VmHWM`), read while it runs; LogBus also
//! reports its own at exit.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::flood::{Flooded, rotated, summary};
use super::target::{self, TargetSpec};

/// Writes `events` lines to `path`: the corpus, repeated.
pub fn write_input(corpus: &[u8], events: u64, path: &Path) -> anyhow::Result<()> {
    let lines: Vec<&[u8]> = corpus
        .split_inclusive(|&b| b == b'\n')
        .filter(|l| l.len() > 1)
        .collect();
    if lines.is_empty() {
        bail!("the corpus is empty");
    }
    let mut out = std::io::BufWriter::new(File::create(path)?);
    for i in 0..events {
        let line = lines[(i % lines.len() as u64) as usize];
        out.write_all(line)?;
        if !line.ends_with(b"\n") {
            out.write_all(b"\n")?;
        }
    }
    out.flush()?;
    Ok(())
}

/// Follows a file another process writes, counting its lines.
struct LineCounter {
    file: Option<File>,
    buf: Vec<u8>,
    lines: u64,
}

impl LineCounter {
    fn new() -> Self {
        LineCounter {
            file: None,
            buf: vec![0; 1 << 20],
            lines: 0,
        }
    }

    /// Reads what was added since the last call.
    fn poll(&mut self, path: &Path) -> anyhow::Result<u64> {
        if self.file.is_none() {
            match File::open(path) {
                Ok(f) => self.file = Some(f),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(self.lines),
                Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
            }
        }
        let file = self.file.as_mut().expect("opened above");
        loop {
            let n = file.read(&mut self.buf)?;
            if n == 0 {
                return Ok(self.lines);
            }
            self.lines += memchr::memchr_iter(b'\n', &self.buf[..n]).count() as u64;
        }
    }
}

/// One target, one run: from its start to `events` lines in its output
/// (at most `limit`), with the CPU it used and its peak RSS.
pub fn run_one(
    spec: &TargetSpec,
    input: &Path,
    events: u64,
    work: &Path,
    tag: &str,
    nice: u32,
    limit: Duration,
) -> anyhow::Result<Flooded> {
    std::fs::create_dir_all(work)?;
    let output = work.join(format!("{tag}.out"));
    let _ = std::fs::remove_file(&output);
    let stats = work.join(format!("{tag}.stats.json"));
    let _ = std::fs::remove_file(&stats);
    let stderr_path = work.join(format!("{tag}.stderr"));
    let stderr = File::create(&stderr_path)?;
    let began = Instant::now();
    let mut child: Child = match spec {
        TargetSpec::LogBus {
            binary, pipeline, ..
        } => Command::new("nice")
            .arg("-n")
            .arg(nice.to_string())
            .arg(binary)
            .arg("run")
            .arg(pipeline)
            .arg("--stats-json")
            .arg(&stats)
            .env("LOGBUS_OUT", &output)
            .env("LOGBUS_LOG", "warn")
            .stdin(File::open(input)?)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?,
        TargetSpec::Peer { command, .. } => Command::new("sh")
            .arg("-c")
            .arg(format!("exec nice -n {nice} {command}"))
            .env("LOAD_IN_FILE", input)
            .env("LOAD_OUT_FILE", &output)
            .env("LOAD_WORK_DIR", work)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("starting peer `{command}`"))?,
    };
    let pid = child.id();
    let mut counter = LineCounter::new();
    let mut cpu = 0.0;
    let mut peak_rss = 0;
    let mut rss_read = Instant::now();
    let mut exited = None;
    let mut secs = None;
    while began.elapsed() < limit {
        cpu = target::proc_cpu(pid).unwrap_or(cpu);
        // The high-water mark only grows, so a read every 20 ms misses only
        // what a process that ends by itself adds in its last 20 ms (LogBus
        // reports its own peak at exit); the read after the last line
        // (below) is exact for one that waits to be stopped.
        if rss_read.elapsed() >= Duration::from_millis(20) {
            peak_rss = target::proc_peak_rss(pid).unwrap_or(peak_rss);
            rss_read = Instant::now();
        }
        if let Some(status) = child.try_wait()? {
            exited = Some(status);
        }
        let lines = counter.poll(&output)?;
        if lines >= events {
            secs = Some(began.elapsed().as_secs_f64());
            peak_rss = target::proc_peak_rss(pid).unwrap_or(peak_rss);
            break;
        }
        if exited.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // Done (or out of time): a peer is told to stop; LogBus ends at the end
    // of its input by itself.
    let deadline = Instant::now() + Duration::from_secs(30);
    while exited.is_none() {
        if let Some(status) = child.try_wait()? {
            exited = Some(status);
            break;
        }
        if matches!(spec, TargetSpec::Peer { .. }) || secs.is_none() || Instant::now() > deadline {
            target::terminate(&mut child, pid)?;
            exited = Some(child.wait()?);
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // Everything it wrote, after it is gone: nothing more, nothing less.
    let lines = counter.poll(&output)?;
    let said = || target::stderr_tail(&stderr_path);
    let Some(secs) = secs else {
        bail!(
            "{tag}: {lines} of {events} lines written after {:.1} s (the target {}); stderr: {}",
            began.elapsed().as_secs_f64(),
            exited.map_or("ran on".to_string(), |s| format!("ended: {s}")),
            said()
        );
    };
    if lines != events {
        bail!("{tag}: {events} lines in, {lines} out; stderr: {}", said());
    }
    if matches!(spec, TargetSpec::LogBus { .. }) {
        // LogBus reports its own total at exit, which includes what it did
        // after the last read of /proc.
        cpu = super::stats_f64(Some(&stats), "cpu_seconds")
            .unwrap_or(cpu)
            .max(cpu);
        peak_rss = super::stats_value(Some(&stats), "peak_rss_bytes")
            .unwrap_or(0)
            .max(peak_rss);
    }
    let _ = std::fs::remove_file(&output);
    Ok(Flooded {
        events,
        secs,
        cpu,
        peak_rss,
    })
}

/// `cargo xtask load files`: every target `reps` times, rotated.
pub fn files_task(
    targets: &[(String, TargetSpec)],
    input: &Path,
    work: &Path,
    events: u64,
    reps: usize,
    nice: u32,
) -> anyhow::Result<String> {
    let limit = Duration::from_secs(600);
    let results = rotated(targets, reps, "files", |spec, tag| {
        run_one(spec, input, events, work, tag, nice, limit)
    })?;
    Ok(summary(targets, &results))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that copies its input is measured; one that loses lines, or
    /// writes nothing, fails the run with the count.
    #[test]
    fn every_line_written_is_a_figure_and_a_line_lost_is_an_error() {
        let work = std::env::temp_dir().join(format!("xtask-files-{}", std::process::id()));
        std::fs::create_dir_all(&work).unwrap();
        let input = work.join("input.ndjson");
        write_input(b"{\"a\":1}\n{\"b\":2}\n", 5_001, &input).unwrap();
        let text = std::fs::read_to_string(&input).unwrap();
        assert_eq!(text.lines().count(), 5_001);
        assert!(text.ends_with("{\"a\":1}\n"));
        let limit = Duration::from_secs(30);
        let copy = TargetSpec::parse_peer(
            "copy=sh -c 'cat \"$LOAD_IN_FILE\" > \"$LOAD_OUT_FILE\"; sleep 30'",
        )
        .unwrap();
        let f = run_one(&copy, &input, 5_001, &work, "copy", 0, limit).unwrap();
        assert_eq!(f.events, 5_001);
        assert!(f.secs > 0.0 && f.rate() > 0.0);
        assert!(f.peak_rss > 0 && f.peak_rss < 64 << 20, "{}", f.peak_rss);
        // A peer that builds a 64 MiB string before copying, then waits to
        // be stopped: its own peak is read, not its shell's or the harness's.
        let hungry = TargetSpec::parse_peer(
            "hungry=awk 'BEGIN { s = \"x\"; for (i = 0; i < 26; i++) s = s s } { print } END { fflush(); system(\"sleep 30\") }' \"$LOAD_IN_FILE\" > \"$LOAD_OUT_FILE\"",
        )
        .unwrap();
        let f = run_one(&hungry, &input, 5_001, &work, "hungry", 0, limit).unwrap();
        assert!(f.peak_rss >= 64 << 20, "{}", f.peak_rss);
        let half = TargetSpec::parse_peer(
            "half=sh -c 'awk \"NR % 2\" \"$LOAD_IN_FILE\" > \"$LOAD_OUT_FILE\"'",
        )
        .unwrap();
        let err = run_one(&half, &input, 5_001, &work, "half", 0, limit)
            .err()
            .expect("half the lines lost");
        assert!(
            format!("{err:#}").contains("2501 of 5001 lines written"),
            "{err:#}"
        );
        let twice = TargetSpec::parse_peer(
            "twice=sh -c 'cat \"$LOAD_IN_FILE\" \"$LOAD_IN_FILE\" > \"$LOAD_OUT_FILE.tmp\" && mv \"$LOAD_OUT_FILE.tmp\" \"$LOAD_OUT_FILE\"; sleep 30'",
        )
        .unwrap();
        let err = run_one(&twice, &input, 5_001, &work, "twice", 0, limit)
            .err()
            .expect("every line twice");
        assert!(
            format!("{err:#}").contains("5001 lines in, 10002 out"),
            "{err:#}"
        );
        let mute = TargetSpec::parse_peer("mute=sleep 600").unwrap();
        let err = run_one(&mute, &input, 10, &work, "mute", 0, Duration::from_secs(1))
            .err()
            .expect("nothing written");
        assert!(
            format!("{err:#}").contains("0 of 10 lines written"),
            "{err:#}"
        );
        let _ = std::fs::remove_dir_all(&work);
    }
}
