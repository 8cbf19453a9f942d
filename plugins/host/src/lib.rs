//! Host-local sources: `scheduler` (an event on a cron expression or an
//! interval) and `exec` (a command's standard output as events). Each is
//! its own cargo feature.

use logbus_plugin_api::Registry;

#[cfg(feature = "source-exec")]
pub mod exec;
#[cfg(feature = "source-scheduler")]
pub mod scheduler;

pub fn register(registry: &mut Registry) {
    #[cfg(feature = "source-scheduler")]
    registry.add(logbus_plugin_api::Typed(scheduler::Scheduler));
    #[cfg(feature = "source-exec")]
    registry.add(logbus_plugin_api::Typed(exec::Exec));
    let _ = registry;
}
