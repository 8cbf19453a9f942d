//! An event's own time, read the one way every sink that places or stamps
//! events by time reads it (OpenSearch's dated index names, CloudWatch's
//! event timestamps and day partitions), so that the same event lands on
//! the same day everywhere.

use chrono::DateTime;
use logbus_plugin_api::{Event, FieldPath};
use serde_json::Value;

/// Milliseconds since the epoch: the field at `path` as RFC 3339 text, or
/// as a number of seconds (below 1e11, i.e. before the year 5138) or of
/// milliseconds (from 1e11: after 1973-03-03); the event's ingest time,
/// to the millisecond, where there is no `path`, no such field, or its
/// value is neither (or a number of milliseconds past what a calendar
/// shows, about 262,000 years either way). Reading goes through the event, so a lazy event
/// parses only this entry.
pub fn event_time_ms(event: &Event, path: Option<&FieldPath>) -> i64 {
    let ingest = (event.meta().ingest_ns / 1_000_000) as i64;
    let Some(value) = path.and_then(|p| event.field(p)) else {
        return ingest;
    };
    match &*value {
        Value::String(s) => DateTime::parse_from_rfc3339(s)
            .map(|t| t.timestamp_millis())
            .unwrap_or(ingest),
        Value::Number(n) => {
            let n = n.as_f64().unwrap_or(0.0);
            let ms = if n.abs() < 1e11 { n * 1000.0 } else { n };
            // A time no calendar can show (past about 262,000 years) is
            // not a time: the ingest time instead.
            let ms = ms as i64;
            match DateTime::from_timestamp_millis(ms) {
                Some(_) => ms,
                None => ingest,
            }
        }
        _ => ingest,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use logbus_plugin_api::Meta;

    /// Each way an event's time is read: RFC 3339 text, seconds or
    /// milliseconds since the epoch (told apart at 1e11), and the ingest
    /// time, to the millisecond, where the field is missing or unreadable.
    #[test]
    fn the_time_field_is_read_as_text_seconds_or_milliseconds_else_ingest() {
        let time = FieldPath::parse("t").unwrap();
        let ingest_ns = 1_700_000_000_123_456_789;
        let at = |t: Value| {
            let fields = serde_json::json!({ "t": t });
            let e = Event::fields(
                fields.as_object().unwrap().clone(),
                Meta::at("t", ingest_ns),
            );
            event_time_ms(&e, Some(&time))
        };
        assert_eq!(at("2026-12-04T10:00:00.250Z".into()), 1_796_378_400_250);
        assert_eq!(
            at("2026-12-04T11:00:00.250+01:00".into()),
            1_796_378_400_250
        );
        assert_eq!(at(1_796_378_400.25.into()), 1_796_378_400_250, "seconds");
        assert_eq!(
            at(1_796_378_400_250u64.into()),
            1_796_378_400_250,
            "milliseconds"
        );
        assert_eq!(
            at(99_999_999_999u64.into()),
            99_999_999_999_000,
            "below 1e11: seconds"
        );
        assert_eq!(
            at(100_000_000_000u64.into()),
            100_000_000_000,
            "1e11: milliseconds"
        );
        assert_eq!(at((-5).into()), -5_000, "before the epoch");
        assert_eq!(
            at((-100_000_000_000i64).into()),
            -100_000_000_000,
            "-1e11: milliseconds"
        );
        let ingest_ms = 1_700_000_000_123;
        assert_eq!(at(1e20.into()), ingest_ms, "past any calendar");
        assert_eq!(at((-1e20).into()), ingest_ms, "before any calendar");
        // The last millisecond chrono shows, and one past it.
        let last = DateTime::<chrono::Utc>::MAX_UTC.timestamp_millis();
        assert_eq!(at(last.into()), last);
        assert_eq!(at((last + 1).into()), ingest_ms);
        assert_eq!(at("yesterday".into()), ingest_ms, "unreadable text");
        assert_eq!(
            at(serde_json::json!({"s": 1})),
            ingest_ms,
            "neither text nor number"
        );
        let e = Event::raw("no fields", Meta::at("t", ingest_ns));
        assert_eq!(event_time_ms(&e, Some(&time)), ingest_ms, "no such field");
        assert_eq!(
            event_time_ms(&e, None),
            ingest_ms,
            "no time field configured"
        );
    }
}
