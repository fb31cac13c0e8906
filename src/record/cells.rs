//! A row as CSV cells, as [`super::CsvLog`] writes every row of every file. Rows hold
//! numbers and lists as such (so report.json has them as numbers and lists); written as
//! CSV, every real number is a plain decimal ([`crate::record::format_plain`]: no exponent, an undefined one an
//! empty cell) and a list of names is one cell, the names space-separated.

use crate::record::{format_exact, format_plain};
use serde::ser::{self, Error as _, Impossible, Serialize, SerializeStruct, Serializer};

/// The name [`Exact`] serialises under: the cell serializer knows it by this.
const EXACT: &str = "ddpbench::Exact";

/// A real number of unknown scale: a number in JSON, as any other, and in a CSV cell
/// every digit of its shortest form ([`format_exact`]) instead of 9 decimals.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Exact(pub f64);

impl Serialize for Exact {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_newtype_struct(EXACT, &self.0)
    }
}

/// For `#[serde(serialize_with)]`: an optional [`Exact`].
pub(crate) fn exact_opt<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.serialize_some(&Exact(*v)),
        None => s.serialize_none(),
    }
}

/// `row` serialised as CSV cells.
pub(crate) struct Cells<'a, T: ?Sized>(pub &'a T);

impl<T: Serialize + ?Sized> Serialize for Cells<'_, T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(CellSerializer(s))
    }
}

/// Forwards to the CSV serializer, with real numbers as plain decimals and a sequence
/// joined into one cell.
struct CellSerializer<S>(S);

/// A struct's fields, each as a cell.
struct CellStruct<S>(S);

impl<S: SerializeStruct> SerializeStruct for CellStruct<S> {
    type Ok = S::Ok;
    type Error = S::Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), S::Error> {
        self.0.serialize_field(key, &Cells(value))
    }
    fn end(self) -> Result<S::Ok, S::Error> {
        self.0.end()
    }
}

/// A sequence's elements, collected into one cell.
struct Joined<S> {
    inner: S,
    parts: Vec<String>,
}

impl<S: Serializer> ser::SerializeSeq for Joined<S> {
    type Ok = S::Ok;
    type Error = S::Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), S::Error> {
        let text = match serde_json::to_value(value).map_err(S::Error::custom)? {
            serde_json::Value::String(s) => s,
            serde_json::Value::Number(n) => n.as_f64().map(format_plain).unwrap_or_default(),
            other => other.to_string(),
        };
        self.parts.push(text);
        Ok(())
    }
    fn end(self) -> Result<S::Ok, S::Error> {
        self.inner.serialize_str(&self.parts.join(" "))
    }
}

macro_rules! forward {
    ($($name:ident($t:ty)),*) => {
        $(fn $name(self, v: $t) -> Result<S::Ok, S::Error> {
            self.0.$name(v)
        })*
    };
}

impl<S: Serializer> Serializer for CellSerializer<S> {
    type Ok = S::Ok;
    type Error = S::Error;
    type SerializeSeq = Joined<S>;
    type SerializeTuple = Impossible<S::Ok, S::Error>;
    type SerializeTupleStruct = Impossible<S::Ok, S::Error>;
    type SerializeTupleVariant = Impossible<S::Ok, S::Error>;
    type SerializeMap = Impossible<S::Ok, S::Error>;
    type SerializeStruct = CellStruct<S::SerializeStruct>;
    type SerializeStructVariant = Impossible<S::Ok, S::Error>;

    forward!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_char(char),
        serialize_str(&str),
        serialize_bytes(&[u8])
    );

    fn serialize_f32(self, v: f32) -> Result<S::Ok, S::Error> {
        self.0.serialize_str(&format_plain(f64::from(v)))
    }
    fn serialize_f64(self, v: f64) -> Result<S::Ok, S::Error> {
        self.0.serialize_str(&format_plain(v))
    }
    fn serialize_none(self) -> Result<S::Ok, S::Error> {
        self.0.serialize_none()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<S::Ok, S::Error> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<S::Ok, S::Error> {
        self.0.serialize_unit()
    }
    fn serialize_unit_struct(self, name: &'static str) -> Result<S::Ok, S::Error> {
        self.0.serialize_unit_struct(name)
    }
    fn serialize_unit_variant(self, name: &'static str, index: u32, variant: &'static str) -> Result<S::Ok, S::Error> {
        self.0.serialize_unit_variant(name, index, variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, name: &'static str, value: &T) -> Result<S::Ok, S::Error> {
        if name == EXACT {
            let v = serde_json::to_value(value).map_err(S::Error::custom)?.as_f64().unwrap_or(f64::NAN);
            return self.0.serialize_str(&format_exact(v));
        }
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<S::Ok, S::Error> {
        Err(S::Error::custom(format!("{name}: a variant with data is no CSV cell")))
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<Joined<S>, S::Error> {
        Ok(Joined {
            inner: self.0,
            parts: Vec::with_capacity(len.unwrap_or(0)),
        })
    }
    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, S::Error> {
        Err(S::Error::custom("a tuple is no CSV cell"))
    }
    fn serialize_tuple_struct(self, name: &'static str, _len: usize) -> Result<Self::SerializeTupleStruct, S::Error> {
        Err(S::Error::custom(format!("{name}: a tuple is no CSV cell")))
    }
    fn serialize_tuple_variant(
        self,
        name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, S::Error> {
        Err(S::Error::custom(format!("{name}: a variant with data is no CSV cell")))
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, S::Error> {
        Err(S::Error::custom("a map is no CSV cell"))
    }
    fn serialize_struct(self, name: &'static str, len: usize) -> Result<CellStruct<S::SerializeStruct>, S::Error> {
        Ok(CellStruct(self.0.serialize_struct(name, len)?))
    }
    fn serialize_struct_variant(
        self,
        name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, S::Error> {
        Err(S::Error::custom(format!("{name}: a variant with data is no CSV cell")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize)]
    #[serde(rename_all = "lowercase")]
    enum Mode {
        Weak,
    }

    #[derive(serde::Serialize)]
    struct Row {
        ids: Vec<String>,
        mode: Mode,
        small_s: f64,
        undefined: f64,
        count: u64,
        maybe: Option<f64>,
        none: Option<f64>,
    }

    #[test]
    fn reals_are_plain_decimals_and_lists_one_cell() {
        let row = Row {
            ids: vec!["a".into(), "b".into()],
            mode: Mode::Weak,
            small_s: 8.787e-6,
            undefined: f64::NAN,
            count: 7,
            maybe: Some(2.0),
            none: None,
        };
        let mut w = csv::Writer::from_writer(Vec::new());
        w.serialize(Cells(&row)).unwrap();
        let text = String::from_utf8(w.into_inner().unwrap()).unwrap();
        assert_eq!(text, "ids,mode,small_s,undefined,count,maybe,none\na b,weak,0.000008787,,7,2,\n");
    }
}
