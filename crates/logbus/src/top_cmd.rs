//! `logbus top`: the live stats of a running pipeline in the terminal, from
//! its HTTP API — the same counters as `/metrics` and the exit summary.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use ratatui::Terminal;
use ratatui::backend::{Backend, TestBackend};
use ratatui::crossterm::event::{self, Event, KeyCode};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table};
use serde_json::Value;

struct Sample {
    stats: Value,
    at: Instant,
}

fn fetch(addr: &str, token: Option<&str>) -> anyhow::Result<Value> {
    let mut req = ureq::get(format!("http://{addr}/api/stats"));
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    let text = req
        .call()
        .with_context(|| format!("reading http://{addr}/api/stats"))?
        .body_mut()
        .read_to_string()?;
    serde_json::from_str(&text).context("the API answered with something that is not stats")
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

fn draw<B: Backend>(
    terminal: &mut Terminal<B>,
    addr: &str,
    now: &Sample,
    prev: Option<&Sample>,
) -> anyhow::Result<()>
where
    B::Error: Send + Sync + 'static,
{
    let s = &now.stats;
    let t = &s["totals"];
    let dt = prev
        .map(|p| now.at.duration_since(p.at).as_secs_f64())
        .unwrap_or(0.0);
    let rate = |id: &str| -> f64 {
        let Some(p) = prev else { return 0.0 };
        let find = |v: &Value| {
            v["stages"]
                .as_array()
                .and_then(|a| {
                    a.iter()
                        .find(|x| x["id"] == id)
                        .map(|x| num(&x["events_out"]))
                })
                .unwrap_or(0.0)
        };
        if dt > 0.0 {
            (find(s) - find(&p.stats)) / dt
        } else {
            0.0
        }
    };
    let header = format!(
        "logbus top — {addr}   emitted {}  committed {}  discarded {}  errored {}   RSS {:.1} MiB   in-flight bound {} events   up {:.0}s   (q quits)",
        num(&t["emitted"]),
        num(&t["committed"]),
        num(&t["discarded"]),
        num(&t["errored"]),
        num(&s["rss_bytes"]) / 1048576.0,
        num(&s["inflight_bound"]["events"]),
        num(&s["elapsed_seconds"]),
    );
    // Sources that acknowledge: what their sinks confirmed, and how long
    // the oldest unconfirmed batch has waited (a stuck sink shows here
    // before anywhere else).
    let acks: Vec<String> = s["stages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|st| {
            ["acked_delivered", "acked_rejected", "acked_errored", "oldest_unacked_ms"]
                .iter()
                .any(|k| num(&st[*k]) > 0.0)
        })
        .map(|st| {
            format!(
                "acknowledgements {}: delivered {}  rejected {}  errored {}  oldest unacknowledged {} ms",
                st["id"].as_str().unwrap_or("?"),
                num(&st["acked_delivered"]),
                num(&st["acked_rejected"]),
                num(&st["acked_errored"]),
                num(&st["oldest_unacked_ms"]),
            )
        })
        .collect();
    let channels = s["channels"].as_array().cloned().unwrap_or_default();
    let rows: Vec<Row> = s["stages"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|st| {
            let id = st["id"].as_str().unwrap_or("?").to_string();
            let queue = channels
                .iter()
                .find(|c| c["stage"] == id.as_str())
                .map(|c| {
                    let (o, cap) = (num(&c["occupancy"]), num(&c["capacity"]).max(1.0));
                    (format!("{o}/{cap}"), o / cap)
                });
            let (queue_text, fill) = queue.unwrap_or(("–".into(), 0.0));
            let color = if fill > 0.9 {
                Color::Red
            } else if fill > 0.5 {
                Color::Yellow
            } else {
                Color::Green
            };
            Row::new(vec![
                Cell::from(id.clone()),
                Cell::from(st["kind"].as_str().unwrap_or("").to_string()),
                Cell::from(format!("{:.0}", rate(&id))),
                Cell::from(format!("{}", num(&st["events_in"]))),
                Cell::from(format!("{}", num(&st["events_out"]))),
                Cell::from(queue_text).style(Style::default().fg(color)),
                Cell::from(format!("{}", num(&st["discarded"]))),
                Cell::from(format!("{}", num(&st["errored"]))),
                Cell::from(format!("{}", num(&st["routed"]))),
            ])
        })
        .collect();
    let table = Table::new(
        rows,
        [
            Constraint::Length(20),
            Constraint::Length(10),
            Constraint::Length(10),
            Constraint::Length(12),
            Constraint::Length(12),
            Constraint::Length(14),
            Constraint::Length(10),
            Constraint::Length(10),
            Constraint::Length(10),
        ],
    )
    .header(
        Row::new([
            "stage",
            "kind",
            "ev/s",
            "in",
            "out",
            "queue",
            "discarded",
            "errored",
            "routed",
        ])
        .style(Style::default().add_modifier(Modifier::BOLD)),
    )
    .block(Block::bordered().title("stages"));
    terminal.draw(|f| {
        let [top, acked, body] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(acks.len() as u16),
            Constraint::Min(3),
        ])
        .areas(f.area());
        f.render_widget(Paragraph::new(header), top);
        f.render_widget(Paragraph::new(acks.join("\n")), acked);
        f.render_widget(table, body);
    })?;
    Ok(())
}

/// Interactive until `q`/Esc; with `once`, one frame (two samples a second
/// apart, so rates are real) printed as text, for scripts and tests.
pub fn run(addr: &str, token: Option<&str>, once: bool) -> anyhow::Result<ExitCode> {
    let first = Sample {
        stats: fetch(addr, token)?,
        at: Instant::now(),
    };
    if once {
        std::thread::sleep(Duration::from_secs(1));
        let second = Sample {
            stats: fetch(addr, token)?,
            at: Instant::now(),
        };
        let mut terminal = Terminal::new(TestBackend::new(
            140,
            // Header, acknowledgement lines (at most one per stage), table.
            4 + 2 * second.stats["stages"].as_array().map_or(0, Vec::len) as u16 + 2,
        ))?;
        draw(&mut terminal, addr, &second, Some(&first))?;
        let buffer = terminal.backend().buffer().clone();
        let mut text = String::new();
        for y in 0..buffer.area.height {
            let line: String = (0..buffer.area.width)
                .map(|x| buffer[(x, y)].symbol().to_string())
                .collect();
            text.push_str(line.trim_end());
            text.push('\n');
        }
        let text = format!("{}\n", text.trim_end());
        crate::emit(&text);
        return Ok(ExitCode::SUCCESS);
    }
    let mut terminal = ratatui::init();
    let result = (|| -> anyhow::Result<()> {
        let mut prev = first;
        loop {
            let now = Sample {
                stats: fetch(addr, token)?,
                at: Instant::now(),
            };
            draw(&mut terminal, addr, &now, Some(&prev))?;
            prev = now;
            if event::poll(Duration::from_secs(1))?
                && let Event::Key(key) = event::read()?
                && matches!(key.code, KeyCode::Char('q') | KeyCode::Esc)
            {
                return Ok(());
            }
        }
    })();
    ratatui::restore();
    result.map(|()| ExitCode::SUCCESS)
}
