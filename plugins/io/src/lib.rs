//! Sources and sinks that move bytes without any external service: the
//! parts an edge agent and a load test need. Each plugin is behind its own
//! cargo feature so a build carries only what a site uses.

#[allow(unused_imports)]
use logbus_plugin_api::{Registry, Typed};

pub mod blackhole;
pub mod file;
pub mod file_set;
pub mod generator;
pub mod line_reader;
pub mod stdio;
pub mod writer_sink;

/// Adds every plugin of this crate that the enabled features include.
pub fn register(registry: &mut Registry) {
    #[cfg(feature = "source-stdin")]
    registry.add(Typed(stdio::StdinSource));
    #[cfg(feature = "source-file")]
    registry.add(Typed(file::FileSource));
    #[cfg(feature = "source-generator")]
    registry.add(Typed(generator::GeneratorSource));
    #[cfg(feature = "sink-stdout")]
    registry.add(Typed(stdio::StdoutSink));
    #[cfg(feature = "sink-file")]
    registry.add(Typed(file::FileSink));
    #[cfg(feature = "sink-blackhole")]
    registry.add(Typed(blackhole::BlackholeSink));
    let _ = registry;
}

#[cfg(test)]
mod register_tests {
    #[test]
    fn register_adds_the_plugin_of_each_enabled_feature() {
        let enabled: &[&str] = &[
            #[cfg(feature = "source-stdin")]
            "source-stdin",
            #[cfg(feature = "source-file")]
            "source-file",
            #[cfg(feature = "source-generator")]
            "source-generator",
            #[cfg(feature = "sink-stdout")]
            "sink-stdout",
            #[cfg(feature = "sink-file")]
            "sink-file",
            #[cfg(feature = "sink-blackhole")]
            "sink-blackhole",
        ];
        logbus_plugin_api::testing::assert_registers(super::register, enabled);
    }
}
