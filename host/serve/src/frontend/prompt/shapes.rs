//! The fields of a request body that routing reads on every request, read as the shapes
//! routing needs and borrowed from the body: no map or list of the body is built (with
//! `serde_json::Value` each message became an ordered map of owned strings, which cost
//! more than the worker's selection). Nothing here judges a value; `prompt::parse` does,
//! naming the field. Everything read is nested within serde_json's recursion limit, as a
//! `Value` would be: a field routing reads refuses what a skipped field would skip.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

/// The visitor methods of the scalar kinds listed, each giving `$value`: a shape that is
/// not what routing reads is still read through, then judged by `prompt::parse`.
macro_rules! scalars_are {
    ($value:expr; $($kind:ident($($arg:ty)?)),*) => {
        $(scalars_are!(@one $value; $kind($($arg)?));)*
    };
    (@one $value:expr; visit_unit()) => {
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok($value)
        }
    };
    (@one $value:expr; $kind:ident($arg:ty)) => {
        fn $kind<E>(self, _: $arg) -> Result<Self::Value, E> {
            Ok($value)
        }
    };
}

/// A JSON value routing reads as a scalar.
#[derive(Debug, PartialEq)]
pub(super) enum Scalar<'a> {
    Null,
    Bool(bool),
    Str(Cow<'a, str>),
    /// A number that is a whole number >= 0 (what `Value::as_u64` reads).
    Whole(u64),
    /// Any other number, list or object.
    Other,
}

/// A chat request's `messages`, when it is a list.
pub(super) enum Messages<'a> {
    List(Vec<Message<'a>>),
    /// `null`, a scalar or an object.
    NotList,
}

/// One element of `messages`.
pub(super) enum Message<'a> {
    Object {
        /// `None` when the message has no `role`.
        role: Option<Scalar<'a>>,
        content: Content<'a>,
    },
    NotObject,
}

/// A message's `content`.
pub(super) enum Content<'a> {
    /// Missing or `null`.
    None,
    Text(Cow<'a, str>),
    /// A list of parts: the `text` of each part that has a string one, in order.
    Parts(Vec<Cow<'a, str>>),
    /// A number, boolean or object.
    Other,
}

/// A value read through and dropped, within the recursion limit (`IgnoredAny` would skip
/// any depth, which is right only for the fields routing does not read).
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(CheckedVisitor)
    }
}

struct CheckedVisitor;

impl<'de> Visitor<'de> for CheckedVisitor {
    type Value = Checked;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    scalars_are!(Checked; visit_bool(bool), visit_i64(i64), visit_u64(u64), visit_f64(f64), visit_str(&str), visit_unit());
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_entry::<IgnoredAny, Checked>()?.is_some() {}
        Ok(Checked)
    }
}

impl<'de> Deserialize<'de> for Scalar<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ScalarVisitor)
    }
}

struct ScalarVisitor;

impl<'de> Visitor<'de> for ScalarVisitor {
    type Value = Scalar<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Scalar<'de>, E> {
        Ok(u64::try_from(v).map_or(Scalar::Other, Scalar::Whole))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Whole(v))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Other)
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Str(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E>(self, v: String) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Str(Cow::Owned(v)))
    }
    fn visit_unit<E>(self) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Scalar<'de>, A::Error> {
        CheckedVisitor.visit_seq(seq).map(|_| Scalar::Other)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Scalar<'de>, A::Error> {
        CheckedVisitor.visit_map(map).map(|_| Scalar::Other)
    }
}

impl<'de> Deserialize<'de> for Messages<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(MessagesVisitor)
    }
}

struct MessagesVisitor;

impl<'de> Visitor<'de> for MessagesVisitor {
    type Value = Messages<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Messages<'de>, A::Error> {
        let mut messages = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(message) = seq.next_element::<Message<'de>>()? {
            messages.push(message);
        }
        Ok(Messages::List(messages))
    }
    // Anything else is not a list: read through (within the limit), then refused.
    scalars_are!(Messages::NotList; visit_bool(bool), visit_i64(i64), visit_u64(u64), visit_f64(f64), visit_str(&str), visit_unit());
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Messages<'de>, A::Error> {
        CheckedVisitor.visit_map(map).map(|_| Messages::NotList)
    }
}

/// A key of a message or a part: the one routing reads, or another.
enum Key {
    Role,
    Content,
    Text,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_str<E>(self, v: &str) -> Result<Key, E> {
                Ok(match v {
                    "role" => Key::Role,
                    "content" => Key::Content,
                    "text" => Key::Text,
                    _ => Key::Other,
                })
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

impl<'de> Deserialize<'de> for Message<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(MessageVisitor)
    }
}

struct MessageVisitor;

impl<'de> Visitor<'de> for MessageVisitor {
    type Value = Message<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    /// A key given twice: the last one counts, as in a JSON map.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Message<'de>, A::Error> {
        let (mut role, mut content) = (None, Content::None);
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Role => role = Some(map.next_value::<Scalar<'de>>()?),
                Key::Content => content = map.next_value::<Content<'de>>()?,
                Key::Text | Key::Other => {
                    map.next_value::<Checked>()?;
                }
            }
        }
        Ok(Message::Object { role, content })
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Message<'de>, A::Error> {
        CheckedVisitor.visit_seq(seq).map(|_| Message::NotObject)
    }
    scalars_are!(Message::NotObject; visit_bool(bool), visit_i64(i64), visit_u64(u64), visit_f64(f64), visit_str(&str), visit_unit());
}

impl<'de> Deserialize<'de> for Content<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ContentVisitor)
    }
}

struct ContentVisitor;

impl<'de> Visitor<'de> for ContentVisitor {
    type Value = Content<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E>(self) -> Result<Content<'de>, E> {
        Ok(Content::None)
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Content<'de>, E> {
        Ok(Content::Text(Cow::Borrowed(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Content<'de>, E> {
        Ok(Content::Text(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E>(self, v: String) -> Result<Content<'de>, E> {
        Ok(Content::Text(Cow::Owned(v)))
    }
    /// The parts: a part that is not an object, or has no string `text`, adds nothing.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content<'de>, A::Error> {
        let mut texts = Vec::new();
        while let Some(Part(text)) = seq.next_element::<Part<'de>>()? {
            texts.extend(text);
        }
        Ok(Content::Parts(texts))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Content<'de>, A::Error> {
        CheckedVisitor.visit_map(map).map(|_| Content::Other)
    }
    scalars_are!(Content::Other; visit_bool(bool), visit_i64(i64), visit_u64(u64), visit_f64(f64));
}

/// One part of a message's content: its `text`, when it is an object with a string one.
struct Part<'a>(Option<Cow<'a, str>>);

impl<'de> Deserialize<'de> for Part<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(PartVisitor)
    }
}

struct PartVisitor;

impl<'de> Visitor<'de> for PartVisitor {
    type Value = Part<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    /// `text` given twice: the last one counts, as in a JSON map.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Part<'de>, A::Error> {
        let mut text = None;
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Text => {
                    text = match map.next_value::<Scalar<'de>>()? {
                        Scalar::Str(value) => Some(value),
                        _ => None,
                    }
                }
                Key::Role | Key::Content | Key::Other => {
                    map.next_value::<Checked>()?;
                }
            }
        }
        Ok(Part(text))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Part<'de>, A::Error> {
        CheckedVisitor.visit_seq(seq).map(|_| Part(None))
    }
    scalars_are!(Part(None); visit_bool(bool), visit_i64(i64), visit_u64(u64), visit_f64(f64), visit_str(&str), visit_unit());
}
