//! Decoding of the parameters object (minus `apiVersion` and `kind`) with JSON paths.
//!
//! A deserializer over the borrowed [`Value`] that behaves like serde_json's own `&Value`
//! deserializer, and additionally
//! - knows the JSON path of every value it hands out, so a decode error names the bad field
//!   (`sharing.timeSlicingConfig.interval`, `devices[2]`), enum variants included;
//! - sees every field the config type skips (`deserialize_ignored_any` on a map entry), so
//!   unknown fields are rejected whatever serde attributes the type uses (`default`,
//!   `rename_all`, `alias`, ...), and suggests the closest field the struct declares.
//!
//! Serde buffers the input of `#[serde(flatten)]` fields and of internally tagged and
//! untagged enums before deciding what it is; fields skipped while decoding such a buffer
//! are invisible to any deserializer, so those types need `#[serde(deny_unknown_fields)]`
//! on the inner types (docs/derive.md).
//!
//! Decoding borrows the input and allocates only for the values the config type keeps and
//! for error messages.

use std::fmt::{self, Write as _};

use serde::de::value::BorrowedStrDeserializer;
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, EnumAccess, Error as _, MapAccess, SeqAccess,
    Unexpected, VariantAccess, Visitor,
};
use serde_json::{Map, Number, Value};

use super::error::{UnknownField, echo};
use super::{ConfigError, ConfigKind};

type Error = DecodeError;

/// Top-level keys that select the config type and are not part of it.
const TYPE_FIELDS: [&str; 2] = ["apiVersion", "kind"];

/// Field names longer than this get no "did you mean" (bounds the edit-distance work).
const MAX_SUGGESTION_INPUT: usize = 64;

/// Longest unknown field name quoted in a message: a key is the user's own text, not a
/// value, but it still must not fill the event.
const MAX_KEY_ECHO: usize = 64;

/// String values of at least this many characters are hidden from messages a `Deserialize`
/// impl wrote itself; shorter ones are too common as words to look for.
const MIN_HIDDEN_VALUE: usize = 4;

/// Replaces a string value of the input found in a message.
const HIDDEN: &str = "(value hidden)";

/// Decodes `parameters`, a JSON object, as `T`, without `apiVersion` and `kind`. With
/// `strict`, any field `T` does not know is an error.
pub(super) fn decode<T: DeserializeOwned>(
    parameters: &Value,
    config: ConfigKind,
    strict: bool,
) -> Result<T, ConfigError> {
    let mut state = State {
        strict,
        unknown: Vec::new(),
        error_path: None,
    };
    let result = T::deserialize(Tracked {
        value: parameters,
        path: &Segment::Root,
        siblings: None,
        state: &mut state,
    });
    // Unknown fields first: a misspelt field usually also causes the decode error ("missing
    // field"), and naming the typo is the more useful message.
    if !state.unknown.is_empty() {
        return Err(ConfigError::UnknownFields {
            config,
            fields: state.unknown,
        });
    }
    result.map_err(|error| ConfigError::Decode {
        config,
        field: state.error_path,
        message: echo(&error.into_message(parameters)),
    })
}

/// A decode error whose message never quotes a string value of the input.
///
/// serde's own messages quote the offending value (`invalid value: string "hunter2"`,
/// ``unknown variant `hunter2` ``), and a config field may hold a secret, such as a token,
/// that would then land in the claim's events and in the kubelet's and the plugin's logs.
/// These messages say what was expected and the *type* found instead. Numbers and booleans
/// are still quoted: they explain a failed range check and are not secrets. A message the
/// config type's own `Deserialize` impl writes (`custom`) cannot be rewritten; every string
/// value of the input is cut out of it instead.
#[derive(Debug)]
pub(super) struct DecodeError {
    message: String,
    /// Written by code outside this module, so it may quote input values.
    foreign: bool,
}

impl DecodeError {
    fn ours(message: String) -> Self {
        Self {
            message,
            foreign: false,
        }
    }

    /// The message, with any string value of `input` hidden if the message is foreign.
    fn into_message(self, input: &Value) -> String {
        if self.foreign {
            hide_values(self.message, input)
        } else {
            self.message
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DecodeError {}

impl de::Error for DecodeError {
    fn custom<T: fmt::Display>(message: T) -> Self {
        Self {
            message: message.to_string(),
            foreign: true,
        }
    }

    fn invalid_type(found: Unexpected<'_>, expected: &dyn de::Expected) -> Self {
        Self {
            foreign: matches!(found, Unexpected::Other(_)),
            message: format!("invalid type: expected {expected}, found {}", Found(found)),
        }
    }

    fn invalid_value(found: Unexpected<'_>, expected: &dyn de::Expected) -> Self {
        Self {
            foreign: matches!(found, Unexpected::Other(_)),
            message: format!("invalid value: expected {expected}, found {}", Found(found)),
        }
    }

    fn invalid_length(len: usize, expected: &dyn de::Expected) -> Self {
        Self::ours(format!("invalid length {len}, expected {expected}"))
    }

    fn unknown_variant(_variant: &str, expected: &'static [&'static str]) -> Self {
        // The variant is usually a string value (`"interval": "Fast"`): not quoted.
        Self::ours(format!("unknown variant, {}", OneOf(expected, "variants")))
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        let field = match field.char_indices().nth(MAX_KEY_ECHO) {
            Some((end, _)) => format!("{}...", &field[..end]),
            None => field.to_owned(),
        };
        Self::ours(format!(
            "unknown field `{field}`, {}",
            OneOf(expected, "fields")
        ))
    }

    fn missing_field(field: &'static str) -> Self {
        Self::ours(format!("missing field `{field}`"))
    }

    fn duplicate_field(field: &'static str) -> Self {
        Self::ours(format!("duplicate field `{field}`"))
    }
}

/// What was found, without the value when it is text.
struct Found<'a>(Unexpected<'a>);

impl fmt::Display for Found<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Unexpected::Bool(value) => write!(f, "boolean `{value}`"),
            Unexpected::Unsigned(value) => write!(f, "integer `{value}`"),
            Unexpected::Signed(value) => write!(f, "integer `{value}`"),
            Unexpected::Float(value) => write!(f, "floating point `{value}`"),
            Unexpected::Char(_) => f.write_str("a character"),
            Unexpected::Str(_) => f.write_str("a string"),
            Unexpected::Bytes(_) => f.write_str("bytes"),
            Unexpected::Unit => f.write_str("null"),
            Unexpected::Option => f.write_str("an optional value"),
            Unexpected::NewtypeStruct => f.write_str("a newtype struct"),
            Unexpected::Seq => f.write_str("an array"),
            Unexpected::Map => f.write_str("an object"),
            Unexpected::Enum => f.write_str("an enum"),
            Unexpected::UnitVariant => f.write_str("a unit variant"),
            Unexpected::NewtypeVariant => f.write_str("a newtype variant"),
            Unexpected::TupleVariant => f.write_str("a tuple variant"),
            Unexpected::StructVariant => f.write_str("a struct variant"),
            Unexpected::Other(other) => f.write_str(other),
        }
    }
}

/// `expected `a``, `expected `a` or `b``, `expected one of `a`, `b`, `c``.
struct OneOf(&'static [&'static str], &'static str);

impl fmt::Display for OneOf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            [] => write!(f, "there are no {}", self.1),
            [only] => write!(f, "expected `{only}`"),
            [first, second] => write!(f, "expected `{first}` or `{second}`"),
            names => {
                f.write_str("expected one of ")?;
                for (index, name) in names.iter().enumerate() {
                    if index > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "`{name}`")?;
                }
                Ok(())
            }
        }
    }
}

/// Cuts every string value of `input` (not keys: those are field names) out of `message`,
/// longest first so that a value containing another is hidden whole. Iterative, so any
/// depth of input is fine.
fn hide_values(mut message: String, input: &Value) -> String {
    let mut values: Vec<&str> = Vec::new();
    let mut pending = vec![input];
    while let Some(value) = pending.pop() {
        match value {
            Value::String(text)
                if text.chars().count() >= MIN_HIDDEN_VALUE && message.contains(text.as_str()) =>
            {
                values.push(text);
            }
            Value::Array(items) => pending.extend(items),
            Value::Object(object) => pending.extend(object.values()),
            _ => {}
        }
    }
    values.sort_unstable_by_key(|text| std::cmp::Reverse(text.len()));
    for text in values {
        if message.contains(text) {
            message = message.replace(text, HIDDEN);
        }
    }
    message
}

/// Hands a JSON number to `visitor` the way serde_json's own `Number` deserializer does.
fn visit_number<'de, V: Visitor<'de>>(number: &Number, visitor: V) -> Result<V::Value, Error> {
    if let Some(value) = number.as_u64() {
        visitor.visit_u64(value)
    } else if let Some(value) = number.as_i64() {
        visitor.visit_i64(value)
    } else if let Some(value) = number.as_f64() {
        visitor.visit_f64(value)
    } else {
        Err(Error::invalid_type(Unexpected::Other("number"), &visitor))
    }
}

/// What a decode learns besides the value.
struct State {
    strict: bool,
    unknown: Vec<UnknownField>,
    /// Path of the innermost value an error passed through; set once.
    error_path: Option<String>,
}

impl State {
    fn note_error(&mut self, path: &Segment<'_>) {
        if self.error_path.is_none() {
            self.error_path = Some(echo(&path.render()));
        }
    }
}

/// A JSON path as a linked list on the stack: no allocation unless rendered.
enum Segment<'a> {
    Root,
    Key {
        parent: &'a Segment<'a>,
        key: &'a str,
    },
    Index {
        parent: &'a Segment<'a>,
        index: usize,
    },
}

impl Segment<'_> {
    fn is_root(&self) -> bool {
        matches!(self, Segment::Root)
    }

    /// `a.b[2].c`, the style of Kubernetes field paths.
    fn render(&self) -> String {
        fn write(segment: &Segment<'_>, out: &mut String) {
            match segment {
                Segment::Root => {}
                Segment::Key { parent, key } => {
                    write(parent, out);
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(key);
                }
                Segment::Index { parent, index } => {
                    write(parent, out);
                    let _ = write!(out, "[{index}]");
                }
            }
        }
        let mut out = String::new();
        write(self, &mut out);
        out
    }
}

/// Deserializer for one value of the input.
struct Tracked<'de, 'p, 's> {
    value: &'de Value,
    path: &'p Segment<'p>,
    /// The fields of the struct this value is a field of, for suggestions.
    siblings: Option<&'static [&'static str]>,
    state: &'s mut State,
}

impl<'de> Tracked<'de, '_, '_> {
    fn invalid_type<V: Visitor<'de>>(&self, visitor: &V) -> Error {
        Error::invalid_type(unexpected(self.value), visitor)
    }

    fn visit_array<V: Visitor<'de>>(
        self,
        array: &'de [Value],
        visitor: V,
    ) -> Result<V::Value, Error> {
        let mut access = ArrayAccess {
            items: array.iter().enumerate(),
            path: self.path,
            state: self.state,
        };
        let value = visitor.visit_seq(&mut access)?;
        if access.items.len() == 0 {
            Ok(value)
        } else {
            Err(Error::invalid_length(
                array.len(),
                &"fewer elements in array",
            ))
        }
    }

    fn visit_object<V: Visitor<'de>>(
        self,
        object: &'de Map<String, Value>,
        fields: Option<&'static [&'static str]>,
        visitor: V,
    ) -> Result<V::Value, Error> {
        let mut access = ObjectAccess {
            entries: object.iter(),
            pending: None,
            path: self.path,
            fields,
            state: self.state,
        };
        let value = visitor.visit_map(&mut access)?;
        match access.remaining() {
            0 => Ok(value),
            _ => Err(Error::invalid_length(
                object.len(),
                &"fewer elements in map",
            )),
        }
    }
}

impl<'de> de::Deserializer<'de> for Tracked<'de, '_, '_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            Value::Null => visitor.visit_unit(),
            Value::Bool(value) => visitor.visit_bool(*value),
            Value::Number(number) => visit_number(number, visitor),
            Value::String(text) => visitor.visit_borrowed_str(text),
            Value::Array(array) => self.visit_array(array, visitor),
            Value::Object(object) => self.visit_object(object, None, visitor),
        }
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            Value::Bool(value) => visitor.visit_bool(*value),
            _ => Err(self.invalid_type(&visitor)),
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            Value::String(text) => visitor.visit_borrowed_str(text),
            _ => Err(self.invalid_type(&visitor)),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            Value::String(text) => visitor.visit_borrowed_str(text),
            Value::Array(array) => self.visit_array(array, visitor),
            _ => Err(self.invalid_type(&visitor)),
        }
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_bytes(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            Value::Null => visitor.visit_unit(),
            _ => Err(self.invalid_type(&visitor)),
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            Value::Array(array) => self.visit_array(array, visitor),
            _ => Err(self.invalid_type(&visitor)),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            Value::Object(object) => self.visit_object(object, None, visitor),
            _ => Err(self.invalid_type(&visitor)),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.value {
            Value::Object(object) => self.visit_object(object, Some(fields), visitor),
            Value::Array(array) => self.visit_array(array, visitor),
            _ => Err(self.invalid_type(&visitor)),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        let (variant, value) = match self.value {
            Value::String(variant) => (variant.as_str(), None),
            Value::Object(object) => {
                let root = self.path.is_root();
                let mut entries = object.iter().filter(|(key, _)| !is_type_field(root, key));
                match (entries.next(), entries.next()) {
                    (Some((variant, value)), None) => (variant.as_str(), Some(value)),
                    _ => {
                        return Err(Error::invalid_value(
                            Unexpected::Map,
                            &"map with a single key",
                        ));
                    }
                }
            }
            _ => {
                return Err(Error::invalid_type(
                    unexpected(self.value),
                    &"string or map",
                ));
            }
        };
        visitor.visit_enum(EnumRef {
            variant,
            value,
            path: self.path,
            state: self.state,
        })
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        // A map entry the type skips: an unknown field (or one marked
        // `skip_deserializing`, which a user must not set either).
        if let (true, Segment::Key { key, .. }) = (self.state.strict, self.path) {
            self.state.unknown.push(UnknownField {
                path: echo(&self.path.render()),
                did_you_mean: self.siblings.and_then(|fields| closest(key, fields)),
            });
        }
        visitor.visit_unit()
    }

    // Numbers: the visitor checks the range and reports any other JSON type.
    serde::forward_to_deserialize_any! {
        i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64
    }
}

struct ArrayAccess<'de, 'p, 's> {
    items: std::iter::Enumerate<std::slice::Iter<'de, Value>>,
    path: &'p Segment<'p>,
    state: &'s mut State,
}

impl<'de> SeqAccess<'de> for ArrayAccess<'de, '_, '_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        let Some((index, value)) = self.items.next() else {
            return Ok(None);
        };
        let path = Segment::Index {
            parent: self.path,
            index,
        };
        let element = seed.deserialize(Tracked {
            value,
            path: &path,
            siblings: None,
            state: self.state,
        });
        element
            .map(Some)
            .inspect_err(|_| self.state.note_error(&path))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len())
    }
}

struct ObjectAccess<'de, 'p, 's> {
    entries: serde_json::map::Iter<'de>,
    pending: Option<(&'de str, &'de Value)>,
    path: &'p Segment<'p>,
    fields: Option<&'static [&'static str]>,
    state: &'s mut State,
}

impl ObjectAccess<'_, '_, '_> {
    /// Entries the visitor did not ask for, not counting the type fields.
    fn remaining(&self) -> usize {
        let root = self.path.is_root();
        self.entries
            .clone()
            .filter(|(key, _)| !is_type_field(root, key))
            .count()
    }
}

/// Whether `key` is `apiVersion` or `kind` of the parameters object itself.
fn is_type_field(root: bool, key: &str) -> bool {
    root && TYPE_FIELDS.contains(&key)
}

impl<'de> MapAccess<'de> for ObjectAccess<'de, '_, '_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let root = self.path.is_root();
        let Some((key, value)) = self.entries.find(|(key, _)| !is_type_field(root, key)) else {
            return Ok(None);
        };
        self.pending = Some((key, value));
        seed.deserialize(BorrowedStrDeserializer::new(key))
            .map(Some)
            .inspect_err(|_| {
                self.state.note_error(&Segment::Key {
                    parent: self.path,
                    key,
                })
            })
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let Some((key, value)) = self.pending.take() else {
            // Only reachable by a Deserialize impl that breaks the MapAccess protocol.
            return Err(Error::custom("map value requested before its key"));
        };
        let path = Segment::Key {
            parent: self.path,
            key,
        };
        let value = seed.deserialize(Tracked {
            value,
            path: &path,
            siblings: self.fields,
            state: self.state,
        });
        value.inspect_err(|_| self.state.note_error(&path))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.remaining())
    }
}

struct EnumRef<'de, 'p, 's> {
    variant: &'de str,
    value: Option<&'de Value>,
    path: &'p Segment<'p>,
    state: &'s mut State,
}

impl<'de, 'p, 's> EnumAccess<'de> for EnumRef<'de, 'p, 's> {
    type Error = Error;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self), Error> {
        let variant = seed.deserialize(BorrowedStrDeserializer::new(self.variant))?;
        Ok((variant, self))
    }
}

impl<'de> EnumRef<'de, '_, '_> {
    /// Runs `decode` on the variant's content, at path `<enum>.<variant>`.
    fn content<T>(
        self,
        expected: &'static str,
        decode: impl FnOnce(Tracked<'de, '_, '_>, &'de Value) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let Some(value) = self.value else {
            return Err(Error::invalid_type(Unexpected::UnitVariant, &expected));
        };
        let path = Segment::Key {
            parent: self.path,
            key: self.variant,
        };
        let tracked = Tracked {
            value,
            path: &path,
            siblings: None,
            state: self.state,
        };
        decode(tracked, value).inspect_err(|_| self.state.note_error(&path))
    }
}

impl<'de> VariantAccess<'de> for EnumRef<'de, '_, '_> {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        match self.value {
            None => Ok(()),
            Some(_) => self.content("unit variant", |tracked, _| {
                de::Deserialize::deserialize(tracked)
            }),
        }
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Error> {
        self.content("newtype variant", |tracked, _| seed.deserialize(tracked))
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, Error> {
        self.content("tuple variant", |tracked, value| match value {
            Value::Array(array) if array.is_empty() => visitor.visit_unit(),
            Value::Array(array) => tracked.visit_array(array, visitor),
            other => Err(Error::invalid_type(unexpected(other), &"tuple variant")),
        })
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.content("struct variant", |tracked, value| match value {
            Value::Object(object) => tracked.visit_object(object, Some(fields), visitor),
            other => Err(Error::invalid_type(unexpected(other), &"struct variant")),
        })
    }
}

fn unexpected(value: &Value) -> Unexpected<'_> {
    match value {
        Value::Null => Unexpected::Unit,
        Value::Bool(value) => Unexpected::Bool(*value),
        Value::Number(number) => {
            if let Some(value) = number.as_u64() {
                Unexpected::Unsigned(value)
            } else if let Some(value) = number.as_i64() {
                Unexpected::Signed(value)
            } else if let Some(value) = number.as_f64() {
                Unexpected::Float(value)
            } else {
                Unexpected::Other("number")
            }
        }
        Value::String(text) => Unexpected::Str(text),
        Value::Array(_) => Unexpected::Seq,
        Value::Object(_) => Unexpected::Map,
    }
}

/// The declared field closest to a misspelt `key`, if it is close enough to be a typo.
fn closest(key: &str, fields: &'static [&'static str]) -> Option<&'static str> {
    if key.len() > MAX_SUGGESTION_INPUT {
        return None;
    }
    fields
        .iter()
        .filter(|field| field.len() <= MAX_SUGGESTION_INPUT)
        .map(|field| (edit_distance(key, field), *field))
        .filter(|(distance, field)| *distance <= (field.chars().count() / 3).max(1))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, field)| field)
}

/// Edit distance counting insertions, deletions, substitutions and swaps of adjacent
/// characters (the usual typos) as one edit each. Inputs are at most
/// [`MAX_SUGGESTION_INPUT`] bytes.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Three rows of the dynamic-programming table: i-2, i-1 and i.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        current[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (previous[j - 1] + cost)
                .min(previous[j] + 1)
                .min(current[j - 1] + 1);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(before[j - 2] + 1);
            }
            current[j] = best;
        }
        std::mem::swap(&mut before, &mut previous);
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    const KIND: ConfigKind = ConfigKind {
        api_version: "test.example.com/v1",
        kind: "Test",
    };

    fn strict<T: DeserializeOwned>(value: Value) -> Result<T, ConfigError> {
        decode(&value, KIND, true)
    }

    fn unknown_paths(error: ConfigError) -> Vec<String> {
        match error {
            ConfigError::UnknownFields { fields, .. } => {
                fields.into_iter().map(|field| field.path).collect()
            }
            other => panic!("expected unknown fields, got {other:?}"),
        }
    }

    fn decode_error(error: ConfigError) -> (Option<String>, String) {
        match error {
            ConfigError::Decode { field, message, .. } => (field, message),
            other => panic!("expected a decode error, got {other:?}"),
        }
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase")]
    struct Outer {
        #[serde(default)]
        inner: Option<Inner>,
        #[serde(default)]
        items: Vec<Inner>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase")]
    struct Inner {
        #[serde(default)]
        count: u32,
    }

    #[test]
    fn type_fields_are_not_part_of_the_body() {
        let value: Outer = strict(json!({"apiVersion": "a/v1", "kind": "K"})).unwrap();
        assert_eq!(
            value,
            Outer {
                inner: None,
                items: vec![]
            }
        );
    }

    #[test]
    fn type_fields_are_only_skipped_at_the_top() {
        let error = strict::<Outer>(json!({"inner": {"kind": "K"}})).unwrap_err();
        assert_eq!(unknown_paths(error), ["inner.kind"]);
    }

    #[test]
    fn unknown_fields_at_every_depth_with_paths() {
        let error = strict::<Outer>(json!({
            "apiVersion": "a/v1",
            "kind": "K",
            "extra": {"deep": 1},
            "inner": {"count": 1, "cuont": 2},
            "items": [{"count": 1}, {"x": true}],
        }))
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid Test (test.example.com/v1): unknown fields `extra`, \
             `inner.cuont` (did you mean `count`?), `items[1].x`"
        );
    }

    #[test]
    fn lenient_ignores_unknown_fields() {
        let value: Outer = decode(&json!({"inner": {"count": 3, "new": 1}}), KIND, false).unwrap();
        assert_eq!(value.inner, Some(Inner { count: 3 }));
    }

    #[test]
    fn decode_errors_carry_the_path() {
        let error = strict::<Outer>(json!({"items": [{}, {"count": "many"}]})).unwrap_err();
        assert_eq!(
            decode_error(error),
            (
                Some("items[1].count".to_owned()),
                "invalid type: expected u32, found a string".to_owned()
            )
        );
        let error = strict::<Outer>(json!({"items": {}})).unwrap_err();
        assert_eq!(decode_error(error).0.as_deref(), Some("items"));
    }

    #[test]
    fn missing_fields_name_their_struct() {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Required {
            needed: u8,
            nested: Option<Nested>,
        }
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Nested {
            deep: u8,
        }
        let error = strict::<Required>(json!({"kind": "K"})).unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid Test (test.example.com/v1): missing field `needed`"
        );
        let error = strict::<Required>(json!({"needed": 1, "nested": {}})).unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid Test (test.example.com/v1): nested: missing field `deep`"
        );
    }

    #[test]
    fn newtype_and_option_wrappers_reach_the_map() {
        #[derive(Debug, Deserialize, PartialEq)]
        struct Wrapper(Inner);
        let value: Wrapper = strict(json!({"kind": "K", "count": 4})).unwrap();
        assert_eq!(value, Wrapper(Inner { count: 4 }));
        let value: Option<Inner> = strict(json!({"count": 5})).unwrap();
        assert_eq!(value, Some(Inner { count: 5 }));
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase")]
    enum Sharing {
        TimeSlicing { interval: Interval },
        Mps(Mps),
        Pair(u8, u8),
        Exclusive,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    enum Interval {
        Default,
        Short,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase")]
    struct Mps {
        active_thread_percentage: Option<u8>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct WithSharing {
        sharing: Sharing,
    }

    #[test]
    fn paths_through_enum_variants() {
        let error =
            strict::<WithSharing>(json!({"sharing": {"timeSlicing": {"interval": "Fast"}}}))
                .unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid Test (test.example.com/v1): sharing.timeSlicing.interval: \
             unknown variant, expected `Default` or `Short`"
        );
        let error = strict::<WithSharing>(
            json!({"sharing": {"timeSlicing": {"interval": "Short", "intervall": 1}}}),
        )
        .unwrap_err();
        assert_eq!(unknown_paths(error), ["sharing.timeSlicing.intervall"]);
        let error = strict::<WithSharing>(json!({"sharing": {"mps": {"x": 1}}})).unwrap_err();
        assert_eq!(unknown_paths(error), ["sharing.mps.x"]);
        let error = strict::<WithSharing>(json!({"sharing": "bogus"})).unwrap_err();
        assert_eq!(decode_error(error).0.as_deref(), Some("sharing"));
        let error = strict::<WithSharing>(json!({"sharing": {"pair": [1, 300]}})).unwrap_err();
        assert_eq!(decode_error(error).0.as_deref(), Some("sharing.pair[1]"));
    }

    #[test]
    fn key_errors_point_at_the_key() {
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Denying {
            known: Option<u8>,
        }
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Holder {
            denying: Denying,
        }
        let error = strict::<Holder>(json!({"denying": {"unknown": 1}})).unwrap_err();
        let (field, message) = decode_error(error);
        assert_eq!(field.as_deref(), Some("denying.unknown"));
        assert_eq!(message, "unknown field `unknown`, expected `known`");
    }

    /// The tracked deserializer must decode exactly what serde_json's own does; only the
    /// error reporting differs.
    #[test]
    fn agrees_with_serde_json() {
        #[derive(Debug, Deserialize, PartialEq)]
        #[serde(rename_all = "camelCase")]
        struct Everything {
            flag: bool,
            small: i8,
            big: u64,
            negative: i64,
            ratio: f64,
            letter: char,
            text: String,
            bytes: Vec<u8>,
            unit: (),
            tuple: (u8, String),
            list: Vec<Option<u16>>,
            map: BTreeMap<String, Sharing>,
            sharing: Vec<Sharing>,
            #[serde(alias = "otherName")]
            aliased: Option<String>,
            #[serde(default)]
            defaulted: u8,
            value: Value,
            newtype: Newtype,
            tagged: Tagged,
            untagged: Untagged,
        }
        #[derive(Debug, Deserialize, PartialEq)]
        struct Newtype(u32);
        #[derive(Debug, Deserialize, PartialEq)]
        #[serde(tag = "type")]
        enum Tagged {
            A { a: u8 },
            B,
        }
        #[derive(Debug, Deserialize, PartialEq)]
        #[serde(untagged)]
        enum Untagged {
            Number(u8),
            Text(String),
        }
        let input = json!({
            "apiVersion": "a/v1",
            "kind": "K",
            "flag": true,
            "small": -5,
            "big": 18_446_744_073_709_551_615u64,
            "negative": -9_000_000_000i64,
            "ratio": 0.25,
            "letter": "x",
            "text": "hello",
            "bytes": [1, 2, 3],
            "unit": null,
            "tuple": [7, "seven"],
            "list": [1, null, 3],
            "map": {"x": "exclusive", "y": {"pair": [1, 2]}},
            "sharing": [{"mps": {"activeThreadPercentage": 50}}, {"timeSlicing": {"interval": "Short"}}],
            "otherName": "via alias",
            "value": {"anything": [1, {"goes": null}]},
            "newtype": 9,
            "tagged": {"type": "A", "a": 1},
            "untagged": "text",
        });
        let mut expected_input = input.clone();
        let object = expected_input.as_object_mut().unwrap();
        object.remove("apiVersion");
        object.remove("kind");
        let expected: Everything = serde_json::from_value(expected_input).unwrap();
        let decoded: Everything = strict(input).unwrap();
        assert_eq!(decoded, expected);
    }

    #[test]
    fn rejects_the_same_inputs_as_serde_json() {
        for (input, path) in [
            (json!({"count": -1}), "count"),
            (json!({"count": 1.5}), "count"),
            (json!({"count": "1"}), "count"),
            (json!({"count": null}), "count"),
            (json!({"count": 4_294_967_296u64}), "count"),
        ] {
            let ours = decode_error(strict::<Inner>(input.clone()).unwrap_err());
            assert!(serde_json::from_value::<Inner>(input).is_err());
            assert_eq!(ours.0.as_deref(), Some(path));
        }
        let ours = strict::<(u8, u8)>(json!({"a": 1})).unwrap_err();
        assert_eq!(
            decode_error(ours).1,
            "invalid type: expected a tuple of size 2, found an object"
        );
    }

    #[test]
    fn buffered_shapes_need_deny_unknown_fields() {
        // Serde decodes internally tagged enums from a buffer this deserializer never sees,
        // so only the inner type's own `deny_unknown_fields` catches unknown fields there.
        #[derive(Debug, Deserialize)]
        #[serde(tag = "strategy")]
        #[allow(dead_code)]
        enum Lax {
            TimeSlicing { interval: Option<String> },
        }
        #[derive(Debug, Deserialize)]
        #[serde(tag = "strategy", deny_unknown_fields)]
        #[allow(dead_code)]
        enum Strict {
            TimeSlicing { interval: Option<String> },
        }
        let input = json!({"strategy": "TimeSlicing", "intervall": "Short"});
        assert!(strict::<Lax>(input.clone()).is_ok());
        let (_, message) = decode_error(strict::<Strict>(input).unwrap_err());
        assert_eq!(message, "unknown field `intervall`, expected `interval`");
    }

    #[test]
    fn externally_tagged_enum_at_the_top() {
        let value: Sharing =
            strict(json!({"apiVersion": "a/v1", "kind": "K", "exclusive": null})).unwrap();
        assert_eq!(value, Sharing::Exclusive);
        assert!(strict::<Sharing>(json!({"exclusive": null, "mps": {}})).is_err());
    }

    #[test]
    fn suggestions() {
        let fields: &'static [&'static str] = &["timeSlicingConfig", "mpsConfig", "strategy"];
        assert_eq!(
            closest("timeSlicingConfg", fields),
            Some("timeSlicingConfig")
        );
        assert_eq!(
            closest("TimeSlicingConfig", fields),
            Some("timeSlicingConfig")
        );
        assert_eq!(closest("strategie", fields), Some("strategy"));
        assert_eq!(closest("mps", fields), None);
        assert_eq!(closest("completelyDifferent", fields), None);
        assert_eq!(closest(&"x".repeat(10_000), fields), None);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("cuont", "count"), 1);
        assert_eq!(edit_distance("abc", "abc"), 0);
    }

    #[test]
    fn long_input_is_shortened_in_messages() {
        let key = "k".repeat(10_000);
        let error = strict::<Inner>(json!({ key: 1 })).unwrap_err();
        assert!(unknown_paths(error)[0].len() < 200);
    }

    /// serde's messages quote string values; a config field may hold a secret.
    #[test]
    fn string_values_are_never_quoted() {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Secretive {
            token: Option<u32>,
            mode: Option<Interval>,
            flag: Option<bool>,
            name: Option<char>,
        }
        for (input, message) in [
            (
                json!({"token": "hunter2-secret"}),
                "invalid type: expected u32, found a string",
            ),
            (
                json!({"mode": "hunter2-secret"}),
                "unknown variant, expected `Default` or `Short`",
            ),
            (
                json!({"mode": {"hunter2-secret": null}}),
                "unknown variant, expected `Default` or `Short`",
            ),
            (
                json!({"flag": "hunter2-secret"}),
                "invalid type: expected a boolean, found a string",
            ),
            (
                json!({"name": "hunter2-secret"}),
                "invalid value: expected a character, found a string",
            ),
        ] {
            let (_, got) = decode_error(strict::<Secretive>(input).unwrap_err());
            assert_eq!(got, message);
        }
    }

    /// A `Deserialize` impl's own message (`custom`) may quote the value: it is cut out.
    #[test]
    fn values_are_cut_out_of_custom_messages() {
        #[derive(Debug)]
        struct Parsed;
        impl<'de> Deserialize<'de> for Parsed {
            fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                Err(D::Error::custom(format!(
                    "cannot parse {text:?} as a duration"
                )))
            }
        }
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Holder {
            timeout: Parsed,
        }
        let (field, message) =
            decode_error(strict::<Holder>(json!({"timeout": "hunter2-secret"})).unwrap_err());
        assert_eq!(field.as_deref(), Some("timeout"));
        assert_eq!(message, "cannot parse \"(value hidden)\" as a duration");
    }

    /// Nesting as deep as serde_json parses (128) decodes without exhausting the stack.
    #[test]
    fn deep_nesting() {
        let mut value = json!("leaf-secret");
        for _ in 0..127 {
            value = json!([value]);
        }
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Deep {
            deep: Vec<Vec<Vec<u8>>>,
        }
        let (field, message) = decode_error(strict::<Deep>(json!({ "deep": value })).unwrap_err());
        assert_eq!(field.as_deref(), Some("deep[0][0][0]"));
        assert_eq!(message, "invalid type: expected u8, found an array");
        let any: Value = strict(json!({ "x": value })).unwrap();
        assert!(any.is_object());
    }
}
