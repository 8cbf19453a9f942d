//! Host-local sources: `scheduler` (an event on a cron expression or an
//! interval), `exec` (a command's standard output as events), `sysinfo`
//! (host metrics as events) and `journald` (the systemd journal through a
//! `journalctl` child, its cursor saved once the sinks finished). Each is
//! its own cargo feature.

use logbus_plugin_api::Registry;

#[cfg(feature = "source-exec")]
pub mod exec;
#[cfg(feature = "source-journald")]
pub mod journald;
#[cfg(feature = "source-scheduler")]
pub mod scheduler;
#[cfg(feature = "source-sysinfo")]
pub mod sysinfo;

pub fn register(registry: &mut Registry) {
    #[cfg(feature = "source-scheduler")]
    registry.add(logbus_plugin_api::Typed(scheduler::Scheduler));
    #[cfg(feature = "source-exec")]
    registry.add(logbus_plugin_api::Typed(exec::Exec));
    #[cfg(feature = "source-sysinfo")]
    registry.add(logbus_plugin_api::Typed(sysinfo::SysInfo));
    #[cfg(feature = "source-journald")]
    registry.add(logbus_plugin_api::Typed(journald::Journald));
    let _ = registry;
}

#[cfg(test)]
mod register_tests {
    #[test]
    fn register_adds_the_plugin_of_each_enabled_feature() {
        let enabled: &[&str] = &[
            #[cfg(feature = "source-scheduler")]
            "source-scheduler",
            #[cfg(feature = "source-exec")]
            "source-exec",
            #[cfg(feature = "source-sysinfo")]
            "source-sysinfo",
            #[cfg(feature = "source-journald")]
            "source-journald",
        ];
        logbus_plugin_api::testing::assert_registers(super::register, enabled);
    }

    /// Each plugin's page lists its options with the schema's defaults.
    #[test]
    fn each_plugin_page_documents_its_options() {
        let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/plugins");
        logbus_plugin_api::testing::assert_pages_document(super::register, &docs);
    }
}
