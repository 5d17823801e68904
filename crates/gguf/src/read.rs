//! Parsing a GGUF file from bytes, with every count, length and offset
//! checked before it is used.
//!
//! The parser runs over the whole file as a byte slice (usually a memory
//! map), so a hostile header can make it fail but never read out of bounds.
//! Allocation is bounded by the file itself: a count is rejected unless the
//! bytes left in the file could hold that many items.

use crate::error::ErrorKind;
use crate::types::GgmlType;
use crate::value::{Metadata, Value, ValueType};

pub const MAGIC: [u8; 4] = *b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: usize = 4;
/// ggml's `GGML_MAX_NAME` (names must be shorter than this).
pub const MAX_NAME: usize = 64;

/// Caps that keep a hostile header from allocating the machine away, on top
/// of the rule that counts must fit in the bytes left.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_string_len: u64,
    pub max_array_len: u64,
    pub max_array_depth: usize,
    pub max_kv_count: u64,
    pub max_tensor_count: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_string_len: 64 << 20,
            max_array_len: 1 << 26,
            max_array_depth: 8,
            max_kv_count: 1 << 20,
            max_tensor_count: 1 << 20,
        }
    }
}

/// One tensor's header entry, checked against the file.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the row length (contiguous), then rows, ...
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset from the start of the data section of the file holding the
    /// data (shard [`TensorInfo::shard`] of a split model).
    pub offset: u64,
    /// Bytes of data (from type and shape).
    pub n_bytes: u64,
    /// Which file of a split model holds the data: 0 for a single file (and
    /// for what [`parse_header`] returns); set when the shards are merged
    /// into one [`crate::GgufFile`].
    pub shard: usize,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
    /// Number of rows (`n_elements / dims[0]`), 1 for a scalar. Saturates
    /// for an empty tensor whose other dimensions are huge.
    pub fn n_rows(&self) -> u64 {
        self.dims
            .iter()
            .skip(1)
            .fold(1u64, |a, &d| a.saturating_mul(d))
    }
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }
}

/// A parsed header: everything but the tensor bytes.
#[derive(Clone, Debug)]
pub struct Header {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Offset of the data section from the start of the file.
    pub data_offset: u64,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    limits: Limits,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], ErrorKind> {
        let left = (self.buf.len() - self.pos) as u64;
        if n > left {
            return Err(ErrorKind::Truncated {
                what: what(),
                offset: self.pos as u64,
                need: n,
                len: self.buf.len() as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], ErrorKind> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, ErrorKind> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, ErrorKind> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    /// Reject `count` items of at least `min_size` bytes each unless the
    /// file has room for them and they are under `limit`.
    fn check_count(
        &self,
        count: u64,
        min_size: u64,
        limit: u64,
        what: &dyn Fn() -> String,
    ) -> Result<(), ErrorKind> {
        if count > limit {
            return Err(ErrorKind::TooLarge {
                what: what(),
                count,
                limit,
            });
        }
        let need = count.saturating_mul(min_size);
        if need > self.remaining() {
            return Err(ErrorKind::Truncated {
                what: what(),
                offset: self.pos as u64,
                need,
                len: self.buf.len() as u64,
            });
        }
        Ok(())
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, ErrorKind> {
        let len = self.u64(&|| format!("{} (string length)", what()))?;
        if len > self.limits.max_string_len {
            return Err(ErrorKind::TooLarge {
                what: format!("{} (string length)", what()),
                count: len,
                limit: self.limits.max_string_len,
            });
        }
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| ErrorKind::BadUtf8 { what: what() })
    }

    fn value(
        &mut self,
        ty: ValueType,
        depth: usize,
        what: &dyn Fn() -> String,
    ) -> Result<Value, ErrorKind> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(what)?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(what)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            ValueType::Bool => {
                let b = self.array::<1>(what)?[0];
                if b > 1 {
                    return Err(ErrorKind::WrongType {
                        key: what(),
                        expected: "bool (0 or 1)".into(),
                        found: format!("byte {b}"),
                    });
                }
                Value::Bool(b == 1)
            }
            ValueType::String => Value::String(self.string(what)?),
            ValueType::Array => {
                if depth >= self.limits.max_array_depth {
                    return Err(ErrorKind::TooDeep {
                        what: what(),
                        limit: self.limits.max_array_depth,
                    });
                }
                let raw = self.u32(&|| format!("{} (array element type)", what()))?;
                let elem = ValueType::from_u32(raw).ok_or_else(|| ErrorKind::BadValueType {
                    what: format!("{} (array element type)", what()),
                    ty: raw,
                })?;
                let count = self.u64(&|| format!("{} (array length)", what()))?;
                // Strings and arrays take at least 8 bytes (their length).
                let min = elem.fixed_size().unwrap_or(8) as u64;
                let lim = self.limits.max_array_len;
                self.check_count(count, min, lim, &|| format!("{} (array length)", what()))?;
                let mut items = Vec::with_capacity(count as usize);
                for i in 0..count {
                    items.push(self.value(elem, depth + 1, &|| format!("{}[{i}]", what()))?);
                }
                Value::Array(elem, items)
            }
        })
    }
}

/// Parse and validate the header of the GGUF file held in `buf`.
pub fn parse_header(buf: &[u8], limits: Limits) -> Result<Header, ErrorKind> {
    if buf.is_empty() {
        return Err(ErrorKind::Empty);
    }
    let mut c = Cursor {
        buf,
        pos: 0,
        limits,
    };
    // A short file that is not a GGUF prefix is "not GGUF", not "truncated".
    let mut magic = [0u8; 4];
    let n = buf.len().min(4);
    magic[..n].copy_from_slice(&buf[..n]);
    if magic[..n] != MAGIC[..n] {
        return Err(ErrorKind::BadMagic(magic));
    }
    c.array::<4>(&|| "magic".into())?;
    let version = c.u32(&|| "version".into())?;
    if version != 2 && version != 3 {
        return Err(ErrorKind::UnsupportedVersion(version));
    }
    let n_tensors = c.u64(&|| "tensor count".into())?;
    let n_kv = c.u64(&|| "metadata count".into())?;
    // A key/value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a
    // tensor entry at least 8 + 4 + 4 + 8.
    c.check_count(n_kv, 13, limits.max_kv_count, &|| "metadata count".into())?;

    let mut metadata = Metadata::new();
    for i in 0..n_kv {
        let key = c.string(&|| format!("metadata entry {i} (key)"))?;
        let raw = c.u32(&|| format!("metadata key `{key}` (value type)"))?;
        let ty = ValueType::from_u32(raw).ok_or_else(|| ErrorKind::BadValueType {
            what: format!("metadata key `{key}`"),
            ty: raw,
        })?;
        let value = c.value(ty, 0, &|| format!("metadata key `{key}`"))?;
        metadata.push_unique(key, value)?;
    }

    // At least 8 (the spec's rule), which also guarantees every tensor's
    // data is aligned for the block structs the kernels cast it to.
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(_) => {
            let a = metadata.get_u64("general.alignment")?;
            if !a.is_power_of_two() || a < 8 {
                return Err(ErrorKind::BadAlignment(a));
            }
            a
        }
    };

    c.check_count(n_tensors, 24, limits.max_tensor_count, &|| {
        "tensor count".into()
    })?;
    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(n_tensors as usize);
    let mut names = std::collections::HashSet::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let name = c.string(&|| format!("tensor entry {i} (name)"))?;
        let bad = |problem: String| ErrorKind::Tensor {
            name: name.clone(),
            problem,
        };
        if name.len() >= MAX_NAME {
            return Err(bad(format!(
                "name is {} bytes long; ggml allows at most {}",
                name.len(),
                MAX_NAME - 1
            )));
        }
        let n_dims = c.u32(&|| format!("tensor `{name}` (dimension count)"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(bad(format!(
                "has {n_dims} dimensions; at most {MAX_DIMS} are allowed"
            )));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            dims.push(c.u64(&|| format!("tensor `{name}` (dimension {d})"))?);
        }
        let raw_ty = c.u32(&|| format!("tensor `{name}` (type)"))?;
        let ty = GgmlType::from_id(raw_ty)
            .ok_or_else(|| bad(format!("unknown ggml type id {raw_ty}")))?;
        let offset = c.u64(&|| format!("tensor `{name}` (offset)"))?;

        // ggml keeps element counts in int64_t.
        let mut n_elements: u64 = 1;
        for &d in &dims {
            n_elements = n_elements
                .checked_mul(d)
                .filter(|n| *n <= i64::MAX as u64)
                .ok_or_else(|| bad(format!("shape {dims:?} overflows the element count")))?;
        }
        let row_len = dims.first().copied().unwrap_or(1);
        let row_bytes = ty.row_bytes(row_len).ok_or_else(|| {
            bad(format!(
                "row length {row_len} is not a multiple of the {ty} block size {}",
                ty.block_size()
            ))
        })?;
        let n_bytes = if n_elements == 0 {
            // A zero dimension: the other dimensions may be anything, so
            // their product must not be formed (found by the fuzzer).
            0
        } else {
            // Bounded by n_elements, which was checked above.
            let n_rows: u64 = dims.iter().skip(1).product();
            row_bytes
                .checked_mul(n_rows)
                .ok_or_else(|| bad(format!("shape {dims:?} overflows the byte size")))?
        };
        if offset % alignment != 0 {
            return Err(bad(format!(
                "data offset {offset} is not a multiple of the alignment {alignment}"
            )));
        }
        if !names.insert(name.clone()) {
            return Err(ErrorKind::DuplicateTensor(name));
        }
        tensors.push(TensorInfo {
            name,
            dims,
            ty,
            offset,
            n_bytes,
            shard: 0,
        });
    }

    let header_end = c.pos as u64;
    let data_offset = header_end.div_ceil(alignment) * alignment;
    let file_len = buf.len() as u64;
    for t in &tensors {
        let end = data_offset
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.n_bytes));
        match end {
            Some(end) if end <= file_len => {}
            _ => {
                return Err(ErrorKind::Tensor {
                    name: t.name.clone(),
                    problem: format!(
                        "data ({} bytes at data offset {}) runs past the end of the file ({} bytes; data section starts at {})",
                        t.n_bytes, t.offset, file_len, data_offset
                    ),
                })
            }
        }
    }

    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}
