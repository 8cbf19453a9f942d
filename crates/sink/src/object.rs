//! Objects: a sink that stores many events as one unit — an S3 object, a
//! file rotated whole — writes them through a format that may have a
//! header, blocks and a footer (Parquet, an Avro container), not only one
//! line per event. The sink owns where the bytes go and when an object is
//! finished; the format owns what the bytes are. Bytes come out as soon as
//! the format has them final (a Parquet row group, an Avro block, a
//! compressor's output), so a large object never has to be whole in
//! memory.

use logbus_plugin_api::Event;

/// Why an event was not written into the open object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Misfit {
    /// It does not fit this object but would start a new one (a Parquet
    /// file's schema is fixed by its first rows): finish the object and
    /// write the event into the next.
    NextObject(String),
    /// It fits no object of this format (a raw event where fields are
    /// needed, a value outside a configured schema): the event is refused.
    Never(String),
}

/// One object being written.
pub trait ObjectWriter: Send {
    /// Adds one event.
    fn write(&mut self, event: &Event) -> Result<(), Misfit>;

    /// Encoded bytes that are final and can be stored now; the sink takes
    /// them (`std::mem::take`) when it uploads a part.
    fn ready(&mut self) -> &mut Vec<u8>;

    /// The object's size so far, as the format measures it (event bytes
    /// before compression for line formats, encoded bytes for container
    /// formats), compared with the sink's `max_object_bytes`.
    fn size(&self) -> u64;

    /// Ends the object: whatever is still buffered and the format's
    /// trailer. Failure fails the object.
    fn finish(self: Box<Self>) -> Result<Vec<u8>, String>;
}

/// A format: makes the writer of each new object.
pub trait ObjectFormat: Send + Sync {
    fn open(&self) -> Result<Box<dyn ObjectWriter>, String>;
}
