//! Events a destination will never take. Every sink on this core ends
//! them the same way: to `<id>.dead` when a stage reads it (the events
//! keep their acknowledgements, so the dead-letter path decides their
//! outcome), otherwise by the sink's policy. One place, so a refused
//! event means the same thing in `/metrics` whichever sink refused it.

use logbus_plugin_api::{Event, Outcome, SinkContext, attach_error};

/// What becomes of refused events when nothing reads `<id>.dead`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unread {
    /// The stage fails; the events are dropped unsettled (errored for
    /// their source, which sends them again after the cause is fixed).
    Fail,
    /// Acknowledged as rejected and counted discarded (`on_rejected:
    /// drop`): the operator chose to lose them.
    Discard,
    /// Acknowledged as rejected and counted errored: the event can never
    /// be written (it fits no object of the format), so sending it again
    /// would not help, but it is not the operator's choice either.
    Error,
}

/// Ends the refused `events` (each with the reason) of `destination`.
/// `Err` is why the stage fails. The first drop of a run is logged as a
/// warning, later ones at debug level: `/metrics` counts every one.
pub(crate) async fn dead_letter(
    cx: &SinkContext,
    events: Vec<(Event, String)>,
    destination: &str,
    unread: Unread,
    warned: &mut bool,
) -> Result<(), String> {
    let n = events.len();
    let Some(first) = events.first().map(|(_, why)| why.clone()) else {
        return Ok(());
    };
    if cx.dead.is_connected() {
        let events = events
            .into_iter()
            .map(|(e, why)| attach_error(e, &cx.id, &why))
            .collect();
        return cx.dead.send(events).await.map_err(|_| {
            format!(
                "{n} events for {destination} could not go to `{}.dead`: its readers stopped",
                cx.id
            )
        });
    }
    match unread {
        Unread::Fail => {
            cx.metrics.add_errored(n as u64);
            return Err(format!("{destination} did not take {n} events: {first}"));
        }
        Unread::Discard => cx.metrics.add_discarded(n as u64),
        Unread::Error => cx.metrics.add_errored(n as u64),
    }
    if !*warned {
        *warned = true;
        tracing::warn!(
            stage = %cx.id,
            destination,
            "{n} events refused and dropped ({}): {first} (connect `{}.dead` to keep them; further drops are counted in /metrics and logged at debug level)",
            if unread == Unread::Discard { "discarded" } else { "errored" },
            cx.id
        );
    } else {
        tracing::debug!(stage = %cx.id, destination, "{n} events refused and dropped: {first}");
    }
    for (mut event, _) in events {
        event.settle(Outcome::Rejected);
    }
    Ok(())
}
