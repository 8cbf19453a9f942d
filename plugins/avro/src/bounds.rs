//! What an Avro input will cost, worked out before anything is decoded.
//!
//! apache-avro trusts the counts it reads: a block of an array declares
//! its item count and the decoder reserves room for all of them before it
//! reads one, and items of `null` take no bytes at all, so 33 bytes
//! declaring 16 Mi nulls asked for 3.7 GB and aborted the process. A
//! deflate block inflates without a limit, and a recursive schema (a
//! linked list) nests as deep as the data says, which the recursive
//! decoder pays for in stack. None of that can be caught from outside
//! once the decoder has started, so this walk goes first: it reads the
//! bytes the way the decoder will, without keeping anything, charges each
//! value at what it will cost in memory (the Avro value and the event
//! field made from it), checks every declared count against the bytes
//! left and the budget, and bounds nesting. Only input that passes is
//! handed to the decoder, which then cannot allocate past the estimate.
//!
//! Malformed input the decoder rejects on its own (a string longer than
//! the bytes left, a union index out of range) ends the walk without an
//! error: the decoder's own message says it better, and it fails before
//! allocating anything large (its per-allocation cap is
//! [`crate::codec::MAX_AVRO_ALLOCATION`]).

use std::borrow::Borrow;
use std::collections::HashMap;
use std::io::Read;

use apache_avro::Schema;
use apache_avro::schema::{Name, Namespace, ResolvedSchema};

/// Deepest nesting of values (arrays in arrays, a linked list of records)
/// the walk, and so the decoder, will follow.
pub const MAX_DEPTH: usize = 64;

/// What one decoded value costs beyond its text: the Avro value, the JSON
/// value it becomes, and a map entry or list slot to hold it.
pub const VALUE_COST: usize = std::mem::size_of::<apache_avro::types::Value>()
    + std::mem::size_of::<serde_json::Value>()
    + 32;

/// Why an input was refused before decoding.
#[derive(Debug, PartialEq, Eq)]
pub struct OverBudget(pub String);

/// The walk over one input: where it is, what it has spent.
struct Walk<'a, N> {
    rest: &'a [u8],
    names: &'a HashMap<Name, N>,
    spent: usize,
    limit: usize,
    /// Bytes of the input before `rest`, for messages.
    offset: usize,
}

/// The walk stopped: over budget (an error), or at input the decoder will
/// reject by itself (not an error here).
enum Stop {
    Over(OverBudget),
    Malformed,
}

type Step = Result<(), Stop>;

/// Checks one bare datum of `schema` (a `datum` event, or the body of a
/// single-object one) against `limit` bytes of decoded values.
pub fn check_datum(bytes: &[u8], schema: &Schema, limit: usize) -> Result<(), OverBudget> {
    let resolved = match ResolvedSchema::try_from(schema) {
        Ok(r) => r,
        // The decoder reports a schema it cannot resolve.
        Err(_) => return Ok(()),
    };
    let mut walk = Walk {
        rest: bytes,
        names: resolved.get_names(),
        spent: 0,
        limit,
        offset: 0,
    };
    finish(walk.value(schema, &None, 0))
}

/// Checks an object container file: its header, then each block, inflated
/// (within the budget) where the codec is `deflate`, walked record by
/// record with the writer's schema.
pub fn check_container(bytes: &[u8], limit: usize) -> Result<(), OverBudget> {
    finish(container(bytes, limit))
}

fn finish(step: Step) -> Result<(), OverBudget> {
    match step {
        Ok(()) | Err(Stop::Malformed) => Ok(()),
        Err(Stop::Over(e)) => Err(e),
    }
}

fn container(bytes: &[u8], limit: usize) -> Step {
    let empty: HashMap<Name, Schema> = HashMap::new();
    let mut header = Walk {
        rest: bytes,
        names: &empty,
        spent: 0,
        limit,
        offset: 0,
    };
    if header.take(4)? != b"Obj\x01" {
        return Err(Stop::Malformed);
    }
    let mut schema_json = None;
    let mut codec = b"null".to_vec();
    loop {
        let count = header.block_count()?;
        if count == 0 {
            break;
        }
        for _ in 0..count {
            let key = header.bytes()?.to_vec();
            let value = header.bytes()?;
            match &key[..] {
                b"avro.schema" => schema_json = Some(value.to_vec()),
                b"avro.codec" => codec = value.to_vec(),
                _ => {}
            }
        }
    }
    header.take(16)?;
    let schema_text =
        String::from_utf8(schema_json.ok_or(Stop::Malformed)?).map_err(|_| Stop::Malformed)?;
    let schema = Schema::parse_str(&schema_text).map_err(|_| Stop::Malformed)?;
    let resolved = ResolvedSchema::try_from(&schema).map_err(|_| Stop::Malformed)?;
    let mut spent = header.spent;
    let mut rest = header.rest;
    while !rest.is_empty() {
        let mut framing = Walk {
            rest,
            names: &empty,
            spent,
            limit,
            offset: bytes.len() - rest.len(),
        };
        let records = framing.long()?;
        let size = usize::try_from(framing.long()?).map_err(|_| Stop::Malformed)?;
        let at = framing.offset;
        let data = framing.take(size)?;
        framing.take(16)?;
        rest = framing.rest;
        let records = usize::try_from(records).map_err(|_| Stop::Malformed)?;
        let inflated;
        let data = match &codec[..] {
            b"null" => data,
            b"deflate" => {
                // The inflated block is held while its records are decoded.
                inflated = inflate(data, limit.saturating_sub(spent), at)?;
                spent += inflated.len();
                &inflated[..]
            }
            // A codec this build cannot read: the decoder says so.
            _ => return Err(Stop::Malformed),
        };
        let mut block = Walk {
            rest: data,
            names: resolved.get_names(),
            spent,
            limit,
            offset: at,
        };
        // Every record is an event of its own and costs one value at
        // least, even one of no bytes: the count is charged before the
        // walk looks at any of them.
        block.charge_each(records, VALUE_COST, "records")?;
        for _ in 0..records {
            block.content(&schema, &None, 0)?;
        }
        spent = block.spent;
    }
    Ok(())
}

/// Inflates a raw deflate block, refusing it once it passes `room` bytes.
fn inflate(data: &[u8], room: usize, at: usize) -> Result<Vec<u8>, Stop> {
    let mut out = Vec::new();
    let mut decoder = flate2::read::DeflateDecoder::new(data).take(room as u64 + 1);
    decoder.read_to_end(&mut out).map_err(|_| Stop::Malformed)?;
    if out.len() > room {
        return Err(Stop::Over(OverBudget(format!(
            "the deflate block at byte {at} inflates past max_decoded_bytes ({} bytes left of the budget)",
            room
        ))));
    }
    Ok(out)
}

/// The schema a named reference stands for, and the namespace names
/// inside it are resolved in.
fn resolve<'n, N: Borrow<Schema>>(
    names: &'n HashMap<Name, N>,
    name: &Name,
    namespace: &Namespace,
) -> Result<(&'n Schema, Namespace), Stop> {
    let full = name.fully_qualified_name(namespace);
    let schema = names.get(&full).ok_or(Stop::Malformed)?.borrow();
    Ok((schema, full.namespace))
}

impl<'a, N: Borrow<Schema>> Walk<'a, N> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Stop> {
        if n > self.rest.len() {
            return Err(Stop::Malformed);
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        self.offset += n;
        Ok(head)
    }

    /// A zig-zag variable-length long, as Avro writes `int` and `long`.
    fn long(&mut self) -> Result<i64, Stop> {
        let mut value: u64 = 0;
        for shift in (0..64).step_by(7) {
            let [byte] = *self.take(1)? else {
                unreachable!("take(1) gives one byte")
            };
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(((value >> 1) as i64) ^ -((value & 1) as i64));
            }
        }
        Err(Stop::Malformed)
    }

    /// A string's or byte array's bytes.
    fn bytes(&mut self) -> Result<&'a [u8], Stop> {
        let len = usize::try_from(self.long()?).map_err(|_| Stop::Malformed)?;
        self.take(len)
    }

    /// An array or map block's item count (the byte size that a negative
    /// count brings along is skipped, as the decoder skips it).
    fn block_count(&mut self) -> Result<usize, Stop> {
        let count = self.long()?;
        let count = if count < 0 {
            self.long()?;
            count.checked_neg().ok_or(Stop::Malformed)?
        } else {
            count
        };
        usize::try_from(count).map_err(|_| Stop::Malformed)
    }

    fn charge(&mut self, cost: usize) -> Step {
        self.spent = self.spent.saturating_add(cost);
        if self.spent > self.limit {
            return Err(Stop::Over(OverBudget(format!(
                "decoding would take more than max_decoded_bytes ({} bytes) by byte {} of {}",
                self.limit,
                self.offset,
                self.offset + self.rest.len()
            ))));
        }
        Ok(())
    }

    /// Charges `count` items of `each` bytes at once, naming what was
    /// declared when that is over the budget.
    fn charge_each(&mut self, count: usize, each: usize, what: &str) -> Step {
        match count.checked_mul(each) {
            Some(total) if self.spent.saturating_add(total) <= self.limit => self.charge(total),
            _ => Err(Stop::Over(OverBudget(format!(
                "byte {} declares {count} {what}, more than max_decoded_bytes ({} bytes) can hold at {each} bytes each",
                self.offset, self.limit
            )))),
        }
    }

    /// One value: charged, then its content.
    fn value(&mut self, schema: &Schema, namespace: &Namespace, depth: usize) -> Step {
        self.charge(VALUE_COST)?;
        self.content(schema, namespace, depth)
    }

    /// A value's bytes and what it holds, its own slot already paid for.
    /// `depth` counts the records, arrays and maps around it, and a record,
    /// array or map deeper than [`MAX_DEPTH`] is refused (a union, a
    /// named reference or a decimal adds a frame to the decoder's stack
    /// but no level of nesting).
    fn content(&mut self, schema: &Schema, namespace: &Namespace, depth: usize) -> Step {
        if depth > MAX_DEPTH
            && matches!(
                schema,
                Schema::Record(_) | Schema::Array(_) | Schema::Map(_)
            )
        {
            return Err(Stop::Over(OverBudget(format!(
                "values nested more than {MAX_DEPTH} deep at byte {}",
                self.offset
            ))));
        }
        match schema {
            Schema::Null => Ok(()),
            Schema::Boolean => self.take(1).map(drop),
            Schema::Int
            | Schema::Long
            | Schema::Date
            | Schema::TimeMillis
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos
            | Schema::Enum(_) => self.long().map(drop),
            Schema::Float => self.take(4).map(drop),
            Schema::Double => self.take(8).map(drop),
            Schema::Duration => self.take(12).map(drop),
            // Text is held twice (the Avro string, the field's copy).
            Schema::String | Schema::Uuid => {
                let n = self.bytes()?.len();
                self.charge(2 * n)
            }
            // Bytes become a list of numbers, one JSON value per byte.
            Schema::Bytes | Schema::BigDecimal => {
                let n = self.bytes()?.len();
                self.charge_each(n, 1 + std::mem::size_of::<serde_json::Value>(), "bytes")
            }
            Schema::Fixed(fixed) => {
                self.take(fixed.size)?;
                self.charge_each(
                    fixed.size,
                    1 + std::mem::size_of::<serde_json::Value>(),
                    "bytes",
                )
            }
            Schema::Decimal(decimal) => self.content(&decimal.inner, namespace, depth),
            Schema::Union(union) => {
                let index = usize::try_from(self.long()?).map_err(|_| Stop::Malformed)?;
                let variant = union.variants().get(index).ok_or(Stop::Malformed)?;
                self.value(variant, namespace, depth)
            }
            Schema::Record(record) => {
                let inner = record.name.fully_qualified_name(namespace).namespace;
                for field in &record.fields {
                    self.charge(2 * field.name.len())?;
                    self.value(&field.schema, &inner, depth + 1)?;
                }
                Ok(())
            }
            Schema::Ref { name } => {
                let (schema, inner) = resolve(self.names, name, namespace)?;
                self.content(schema, &inner, depth)
            }
            Schema::Array(array) => self.items(&array.items, namespace, depth, 0),
            // A map entry also holds its key, a string.
            Schema::Map(map) => self.items(&map.types, namespace, depth, 1),
        }
    }

    /// The blocks of an array or map. The decoder reserves a block's
    /// declared count before reading any item, so the count is paid for
    /// first. Items of no bytes (nulls, records of nulls) are paid for all
    /// at once and not walked one by one; every other item takes a byte at
    /// least, so the walk over them ends with the input.
    fn items(
        &mut self,
        item: &Schema,
        namespace: &Namespace,
        depth: usize,
        key_bytes: usize,
    ) -> Step {
        loop {
            let count = self.block_count()?;
            if count == 0 {
                return Ok(());
            }
            let free = key_bytes == 0 && self.takes_no_bytes(item, namespace, 0);
            let each = VALUE_COST
                + if free {
                    self.free_cost(item, namespace, 0)
                } else {
                    0
                };
            self.charge_each(count, each, "items")?;
            if free {
                continue;
            }
            if count > self.rest.len() {
                // Each item takes a byte at least: the decoder runs out of
                // input (after a reservation already paid for above).
                return Err(Stop::Malformed);
            }
            for _ in 0..count {
                if key_bytes > 0 {
                    let n = self.bytes()?.len();
                    self.charge(2 * n)?;
                }
                self.content(item, namespace, depth + 1)?;
            }
        }
    }

    /// Whether every value of `schema` is encoded in no bytes at all.
    fn takes_no_bytes(&self, schema: &Schema, namespace: &Namespace, depth: usize) -> bool {
        if depth > MAX_DEPTH {
            return false;
        }
        match schema {
            Schema::Null => true,
            Schema::Fixed(fixed) => fixed.size == 0,
            Schema::Record(record) => {
                let inner = record.name.fully_qualified_name(namespace).namespace;
                record
                    .fields
                    .iter()
                    .all(|f| self.takes_no_bytes(&f.schema, &inner, depth + 1))
            }
            Schema::Ref { name } => resolve(self.names, name, namespace)
                .is_ok_and(|(s, inner)| self.takes_no_bytes(s, &inner, depth + 1)),
            _ => false,
        }
    }

    /// What a value of no bytes holds beyond its own slot (a record's
    /// fields, each a value with a name).
    fn free_cost(&self, schema: &Schema, namespace: &Namespace, depth: usize) -> usize {
        match schema {
            Schema::Record(record) if depth <= MAX_DEPTH => {
                let inner = record.name.fully_qualified_name(namespace).namespace;
                record.fields.iter().fold(0usize, |sum, f| {
                    sum.saturating_add(VALUE_COST + 2 * f.name.len())
                        .saturating_add(self.free_cost(&f.schema, &inner, depth + 1))
                })
            }
            Schema::Ref { name } if depth <= MAX_DEPTH => resolve(self.names, name, namespace)
                .map_or(0, |(s, inner)| self.free_cost(s, &inner, depth + 1)),
            _ => 0,
        }
    }
}
