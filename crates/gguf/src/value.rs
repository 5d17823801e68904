//! Metadata values and typed access to them.

use crate::error::ErrorKind;
use std::fmt;

/// The type tag of a metadata value (`gguf_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_u32(v: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match v {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Bytes a value of this type takes on disk, for fixed-size types.
    pub fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

/// A metadata value. Arrays keep their element type so an empty array
/// round-trips.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(ValueType, Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(..) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// A description of the type for error messages: `u32`, `array of string`.
    pub fn type_description(&self) -> String {
        match self {
            Value::Array(t, _) => format!("array of {}", t.name()),
            v => v.value_type().name().to_string(),
        }
    }

    /// Any integer that fits in `u64` (unsigned types, non-negative signed).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer that fits in `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(v) => Some(v as i64),
            Value::I16(v) => Some(v as i64),
            Value::I32(v) => Some(v as i64),
            Value::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// A float (f32 or f64; f64 narrowed).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<(ValueType, &[Value])> {
        match self {
            Value::Array(t, v) => Some((*t, v)),
            _ => None,
        }
    }
}

impl fmt::Display for Value {
    /// Short human-readable form; long arrays are elided.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::String(s) => {
                let short: String = s.chars().take(60).collect();
                if short.len() < s.len() {
                    write!(f, "{short:?}… ({} bytes)", s.len())
                } else {
                    write!(f, "{s:?}")
                }
            }
            Value::Array(t, items) => {
                write!(f, "[")?;
                for (i, v) in items.iter().take(6).enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{v}")?;
                }
                if items.len() > 6 {
                    write!(f, ", … {} {} items", items.len(), t.name())?;
                }
                write!(f, "]")
            }
        }
    }
}

/// Ordered key/value metadata with typed getters whose errors name the key
/// and the expected type.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
}

impl Metadata {
    pub fn new() -> Metadata {
        Metadata::default()
    }

    pub fn entries(&self) -> &[(String, Value)] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Set `key`, replacing an existing value in place (order kept) or
    /// appending.
    pub fn set(&mut self, key: impl Into<String>, value: Value) {
        let key = key.into();
        match self.entries.iter_mut().find(|(k, _)| *k == key) {
            Some(e) => e.1 = value,
            None => self.entries.push((key, value)),
        }
    }

    pub fn remove(&mut self, key: &str) -> Option<Value> {
        let i = self.entries.iter().position(|(k, _)| k == key)?;
        Some(self.entries.remove(i).1)
    }

    pub(crate) fn push_unique(&mut self, key: String, value: Value) -> Result<(), ErrorKind> {
        if self.get(&key).is_some() {
            return Err(ErrorKind::DuplicateKey(key));
        }
        self.entries.push((key, value));
        Ok(())
    }

    fn require(&self, key: &str) -> Result<&Value, ErrorKind> {
        self.get(key).ok_or_else(|| ErrorKind::MissingKey {
            key: key.to_string(),
        })
    }

    fn typed<T>(
        &self,
        key: &str,
        expected: &str,
        f: impl FnOnce(&Value) -> Option<T>,
    ) -> Result<T, ErrorKind> {
        let v = self.require(key)?;
        f(v).ok_or_else(|| ErrorKind::WrongType {
            key: key.to_string(),
            expected: expected.to_string(),
            found: format!("{} ({v})", v.type_description()),
        })
    }

    pub fn get_str(&self, key: &str) -> Result<&str, ErrorKind> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| ErrorKind::WrongType {
            key: key.to_string(),
            expected: "string".into(),
            found: v.type_description(),
        })
    }

    /// An unsigned integer of any width (or a non-negative signed one).
    pub fn get_u64(&self, key: &str) -> Result<u64, ErrorKind> {
        self.typed(key, "non-negative integer", Value::as_u64)
    }

    pub fn get_u32(&self, key: &str) -> Result<u32, ErrorKind> {
        self.typed(key, "integer in u32 range", |v| {
            v.as_u64().and_then(|x| u32::try_from(x).ok())
        })
    }

    pub fn get_i64(&self, key: &str) -> Result<i64, ErrorKind> {
        self.typed(key, "integer", Value::as_i64)
    }

    pub fn get_f32(&self, key: &str) -> Result<f32, ErrorKind> {
        self.typed(key, "float", Value::as_f32)
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, ErrorKind> {
        self.typed(key, "bool", Value::as_bool)
    }

    pub fn get_array(&self, key: &str) -> Result<(ValueType, &[Value]), ErrorKind> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| ErrorKind::WrongType {
            key: key.to_string(),
            expected: "array".into(),
            found: v.type_description(),
        })
    }

    /// An array of strings (e.g. `tokenizer.ggml.tokens`).
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, ErrorKind> {
        let (t, items) = self.get_array(key)?;
        let wrong = || ErrorKind::WrongType {
            key: key.to_string(),
            expected: "array of string".into(),
            found: format!("array of {}", t.name()),
        };
        if t != ValueType::String {
            return Err(wrong());
        }
        items.iter().map(|v| v.as_str().ok_or_else(wrong)).collect()
    }

    /// Optional variants: `Ok(None)` if absent, an error if present with the
    /// wrong type.
    pub fn opt<T>(
        &self,
        key: &str,
        get: impl FnOnce(&Metadata, &str) -> Result<T, ErrorKind>,
    ) -> Result<Option<T>, ErrorKind> {
        if self.get(key).is_none() {
            Ok(None)
        } else {
            get(self, key).map(Some)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn getters_name_key_and_type() {
        let mut m = Metadata::new();
        m.set("a.n", Value::U32(7));
        m.set("a.s", Value::String("x".into()));
        m.set("a.neg", Value::I32(-1));
        assert_eq!(m.get_u32("a.n").unwrap(), 7);
        assert_eq!(m.get_u64("a.n").unwrap(), 7);
        let e = m.get_u32("a.s").unwrap_err().to_string();
        assert!(e.contains("`a.s`") && e.contains("string"), "{e}");
        let e = m.get_u32("a.neg").unwrap_err().to_string();
        assert!(e.contains("`a.neg`") && e.contains("i32"), "{e}");
        let e = m.get_str("missing.key").unwrap_err().to_string();
        assert!(e.contains("`missing.key` is missing"), "{e}");
        assert_eq!(m.opt("nope", Metadata::get_u32).unwrap(), None);
        assert!(m.opt("a.s", Metadata::get_u32).is_err());
    }

    #[test]
    fn set_keeps_order() {
        let mut m = Metadata::new();
        m.set("a", Value::U8(1));
        m.set("b", Value::U8(2));
        m.set("a", Value::U8(3));
        let keys: Vec<_> = m.entries().iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["a", "b"]);
        assert_eq!(m.get("a"), Some(&Value::U8(3)));
    }
}
