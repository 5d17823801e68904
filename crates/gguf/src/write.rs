//! Writing GGUF v3 files: the header up front (every size is known from type
//! and shape), then tensor data streamed in order, each padded to the
//! alignment as ggml does. Reading a file we wrote and writing it again gives
//! the same bytes.

use crate::error::ErrorKind;
use crate::read::{DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS, MAX_NAME};
use crate::types::GgmlType;
use crate::value::{Metadata, Value};
use std::io::Write;

/// A tensor to be written: name, ggml-order shape and type.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
}

impl TensorSpec {
    pub fn n_bytes(&self) -> Option<u64> {
        let row = self.ty.row_bytes(self.dims.first().copied().unwrap_or(1))?;
        let rows = self
            .dims
            .iter()
            .skip(1)
            .try_fold(1u64, |a, &d| a.checked_mul(d))?;
        if self.dims.contains(&0) {
            return Some(0);
        }
        row.checked_mul(rows)
    }
}

/// Header contents of a file to write.
#[derive(Clone, Debug, Default)]
pub struct Builder {
    pub metadata: Metadata,
    tensors: Vec<TensorSpec>,
}

impl Builder {
    pub fn new(metadata: Metadata) -> Builder {
        Builder {
            metadata,
            tensors: Vec::new(),
        }
    }

    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    /// Add a tensor; its data is written later, in the order added.
    pub fn add_tensor(&mut self, spec: TensorSpec) -> Result<(), ErrorKind> {
        let bad = |problem: String| ErrorKind::Tensor {
            name: spec.name.clone(),
            problem,
        };
        if spec.name.len() >= MAX_NAME {
            return Err(bad(format!("name longer than {} bytes", MAX_NAME - 1)));
        }
        if spec.dims.len() > MAX_DIMS {
            return Err(bad(format!("more than {MAX_DIMS} dimensions")));
        }
        if spec.n_bytes().is_none() {
            return Err(bad(format!(
                "shape {:?} does not fit type {} (row length must be a multiple of {})",
                spec.dims,
                spec.ty,
                spec.ty.block_size()
            )));
        }
        if self.tensors.iter().any(|t| t.name == spec.name) {
            return Err(ErrorKind::DuplicateTensor(spec.name));
        }
        self.tensors.push(spec);
        Ok(())
    }

    pub fn alignment(&self) -> Result<u64, ErrorKind> {
        match self.metadata.get("general.alignment") {
            None => Ok(DEFAULT_ALIGNMENT),
            Some(_) => {
                let a = self.metadata.get_u64("general.alignment")?;
                if !a.is_power_of_two() || a < 8 {
                    return Err(ErrorKind::BadAlignment(a));
                }
                Ok(a)
            }
        }
    }

    /// Offsets (from the data section) each tensor will get.
    pub fn offsets(&self) -> Result<Vec<u64>, ErrorKind> {
        let align = self.alignment()?;
        let mut at = 0u64;
        let mut out = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            out.push(at);
            let n = t.n_bytes().unwrap_or(0);
            at = at
                .checked_add(n.div_ceil(align) * align)
                .ok_or_else(|| ErrorKind::Write("total tensor size overflows".into()))?;
        }
        Ok(out)
    }

    /// Write the header and padding; returns the writer for tensor data.
    pub fn write_header<W: Write>(&self, mut w: W) -> Result<TensorWriter<W>, ErrorKind> {
        let align = self.alignment()?;
        let offsets = self.offsets()?;
        let mut head = Vec::new();
        head.extend_from_slice(&MAGIC);
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in self.metadata.entries() {
            put_string(&mut head, k);
            head.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            put_value(&mut head, v);
        }
        for (t, off) in self.tensors.iter().zip(&offsets) {
            put_string(&mut head, &t.name);
            head.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&t.ty.id().to_le_bytes());
            head.extend_from_slice(&off.to_le_bytes());
        }
        let padded = (head.len() as u64).div_ceil(align) * align;
        head.resize(padded as usize, 0);
        w.write_all(&head)?;
        Ok(TensorWriter {
            w,
            specs: self.tensors.clone(),
            next: 0,
            align,
        })
    }
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_string(out, s),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Array(t, items) => {
            out.extend_from_slice(&(*t as u32).to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for i in items {
                put_value(out, i);
            }
        }
    }
}

/// Streams tensor data in header order.
pub struct TensorWriter<W: Write> {
    w: W,
    specs: Vec<TensorSpec>,
    next: usize,
    align: u64,
}

impl<W: Write> TensorWriter<W> {
    /// The spec of the tensor whose data is expected next.
    pub fn next_spec(&self) -> Option<&TensorSpec> {
        self.specs.get(self.next)
    }

    /// Write the next tensor's data (exactly its byte size) and padding.
    pub fn write_tensor(&mut self, data: &[u8]) -> Result<(), ErrorKind> {
        let spec = self.specs.get(self.next).ok_or_else(|| {
            ErrorKind::Write("more tensor data than tensors in the header".into())
        })?;
        let n = spec.n_bytes().unwrap_or(0);
        if data.len() as u64 != n {
            return Err(ErrorKind::Tensor {
                name: spec.name.clone(),
                problem: format!("got {} bytes of data, expected {n}", data.len()),
            });
        }
        self.w.write_all(data)?;
        let pad = (n.div_ceil(self.align) * self.align - n) as usize;
        self.w.write_all(&vec![0u8; pad])?;
        self.next += 1;
        Ok(())
    }

    /// Check every tensor was written and hand back the writer.
    pub fn finish(mut self) -> Result<W, ErrorKind> {
        if let Some(s) = self.specs.get(self.next) {
            return Err(ErrorKind::Tensor {
                name: s.name.clone(),
                problem: "header lists it but no data was written".into(),
            });
        }
        self.w.flush()?;
        Ok(self.w)
    }
}
