//! From an OpenAI request body to what routing needs: the model, the prompt as chained
//! block hashes, the expected output length, and whether the answer streams.
//!
//! With the model's tokenizer (`models.NAME.tokenizer`), the prompt is the token ids the
//! engine will see: chat messages rendered by the model's chat template, then encoded.
//! Without one the prompt's text stands in for its tokens: every 4 bytes of the
//! rendered prompt count as one pseudo-token (about what BPE tokenizers average on
//! English), hashed in blocks of the router's `block_size` exactly as token ids are. Equal
//! prompt prefixes therefore give equal block hashes, which is all prefix-aware routing
//! needs; block counts are approximate, and hashes do not match an engine's own (so this
//! mode pairs with `kv_tracking: predicted`, not with engine KV events).

use serde_json::value::RawValue;
use serde_json::Value;
use shapes::{Content, Message, Messages, Scalar};

use super::tokenizer::ModelTokenizer;
use switchyard_fleet::kv_index::hash_tokens;

/// Bytes of rendered prompt text per pseudo-token.
pub const BYTES_PER_TOKEN: usize = 4;

/// Which OpenAI endpoint a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    ChatCompletions,
    Completions,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
        }
    }
}

/// A request body that cannot be routed: the field at fault and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidRequest {
    pub param: Option<&'static str>,
    pub message: String,
}

#[cold]
fn invalid(param: &'static str, message: impl Into<String>) -> InvalidRequest {
    InvalidRequest {
        param: Some(param),
        message: message.into(),
    }
}

/// What routing reads from one request body.
#[derive(Clone, Debug, PartialEq)]
pub struct Prompt {
    pub model: String,
    pub stream: bool,
    /// The prompt in KV blocks (a trailing partial block counts).
    pub request_blocks: u64,
    /// Chained hashes of the prompt's full blocks (shared with each selection's request).
    pub block_hashes: std::sync::Arc<[u64]>,
    /// The prompt's tokens (pseudo-tokens of its text when the model has no tokenizer).
    pub tokens: Vec<u32>,
    pub expected_output_tokens: Option<u64>,
    /// OpenAI's `user` field, a tenant source (`request_attributes.tenant`).
    pub user: Option<String>,
}

/// A field's value as `T` (a `Value`, or one of the borrowed `shapes`): `null` is a
/// value, a missing field is `None`; a value nested past serde_json's recursion limit is
/// refused, naming the field.
fn value<'a, T: serde::Deserialize<'a>>(
    field: Given<'a>,
    param: &'static str,
) -> Result<Option<T>, InvalidRequest> {
    let Some(raw) = field.0 else {
        return Ok(None);
    };
    serde_json::from_str(raw.get())
        .map(Some)
        .map_err(|e| invalid(param, format!("`{param}` cannot be read: {e}")))
}

/// The fields of a request body that routing reads, each still its JSON text: the body's
/// other fields are skipped without being built into a map (the frontend and the
/// picker parse every request's body, and most of a body is what the engine reads).
#[derive(serde::Deserialize)]
struct Fields<'a> {
    #[serde(default, borrow)]
    model: Given<'a>,
    #[serde(default, borrow)]
    stream: Given<'a>,
    #[serde(default, borrow)]
    messages: Given<'a>,
    #[serde(default, borrow)]
    prompt: Given<'a>,
    #[serde(default, borrow)]
    max_completion_tokens: Given<'a>,
    #[serde(default, borrow)]
    max_tokens: Given<'a>,
    #[serde(default, borrow)]
    user: Given<'a>,
}

/// A field's JSON text when the body has the field, `null` included (an `Option` would
/// read `null` as absent).
#[derive(Clone, Copy, Default)]
struct Given<'a>(Option<&'a RawValue>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for Given<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        <&'a RawValue>::deserialize(deserializer).map(|raw| Given(Some(raw)))
    }
}

/// A request body must be one JSON object: a struct also reads from a JSON list (its
/// fields in order), so anything that does not start with `{` is refused here, as not
/// JSON or not an object.
fn must_be_object(body: &[u8]) -> Result<(), InvalidRequest> {
    if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{') {
        return Ok(());
    }
    serde_json::from_slice::<serde::de::IgnoredAny>(body).map_err(not_json)?;
    Err(InvalidRequest {
        param: None,
        message: "the body must be a JSON object".into(),
    })
}

fn not_json(e: serde_json::Error) -> InvalidRequest {
    InvalidRequest {
        param: None,
        message: format!("the body is not valid JSON: {e}"),
    }
}

impl<'a> Fields<'a> {
    /// The fields of `body`, which must be one JSON object (a field given twice is
    /// refused, where a map would keep either).
    fn read(body: &'a [u8]) -> Result<Self, InvalidRequest> {
        must_be_object(body)?;
        serde_json::from_slice(body).map_err(not_json)
    }

    /// Each field read as the shape routing needs, on its own: a value it cannot read
    /// (nested past the recursion limit) is refused naming the field.
    fn shapes(self) -> Result<Shapes<'a>, InvalidRequest> {
        Ok(Shapes {
            model: value(self.model, "model")?,
            stream: value(self.stream, "stream")?,
            messages: value(self.messages, "messages")?,
            prompt: self.prompt.0,
            max_completion_tokens: value(self.max_completion_tokens, "max_completion_tokens")?,
            max_tokens: value(self.max_tokens, "max_tokens")?,
            user: value(self.user, "user")?,
        })
    }
}

/// The fields routing reads, as the shapes it needs (`None`: the body lacks the field;
/// JSON's `null` is a shape). Read in one pass over the body (`Shapes::read`); a body that
/// pass refuses is read again field by field (`Fields`), which either names the field at
/// fault or, for a field nested just past what the one pass allows, reads it.
#[derive(Default)]
struct Shapes<'a> {
    model: Option<Scalar<'a>>,
    stream: Option<Scalar<'a>>,
    messages: Option<Messages<'a>>,
    /// A completion's prompt, read as a JSON value only for a completion.
    prompt: Option<&'a RawValue>,
    max_completion_tokens: Option<Scalar<'a>>,
    max_tokens: Option<Scalar<'a>>,
    user: Option<Scalar<'a>>,
}

impl<'a> Shapes<'a> {
    /// The body read once: what every request pays. Reading each field's text first and
    /// then each field on its own (`Fields`) took 5,600 instructions for the bench's body
    /// against 4,000, and ran the code of two readers (docs/BENCHMARKS.md, "The decision
    /// cold"), so that reading is kept for the bodies this pass refuses.
    fn read(body: &'a [u8]) -> Result<Self, InvalidRequest> {
        must_be_object(body)?;
        if let Ok(shapes) = serde_json::from_slice(body) {
            return Ok(shapes);
        }
        Fields::read(body)?.shapes()
    }
}

impl<'de> serde::Deserialize<'de> for Shapes<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::{Error, IgnoredAny, MapAccess, Visitor};

        /// A body's key: a field routing reads, or another (skipped).
        enum Key {
            Model,
            Stream,
            Messages,
            Prompt,
            MaxCompletionTokens,
            MaxTokens,
            User,
            Other,
        }

        impl<'de> serde::Deserialize<'de> for Key {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct KeyVisitor;
                impl Visitor<'_> for KeyVisitor {
                    type Value = Key;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("an object key")
                    }
                    fn visit_str<E>(self, key: &str) -> Result<Key, E> {
                        Ok(match key {
                            "model" => Key::Model,
                            "stream" => Key::Stream,
                            "messages" => Key::Messages,
                            "prompt" => Key::Prompt,
                            "max_completion_tokens" => Key::MaxCompletionTokens,
                            "max_tokens" => Key::MaxTokens,
                            "user" => Key::User,
                            _ => Key::Other,
                        })
                    }
                }
                deserializer.deserialize_str(KeyVisitor)
            }
        }

        /// A field's value; a field given twice is refused (as `Fields` refuses it).
        fn once<T, E: Error>(slot: &mut Option<T>, value: T, name: &'static str) -> Result<(), E> {
            match slot.replace(value) {
                Some(_) => Err(E::duplicate_field(name)),
                None => Ok(()),
            }
        }

        struct ShapesVisitor;

        impl<'de> Visitor<'de> for ShapesVisitor {
            type Value = Shapes<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Shapes<'de>, A::Error> {
                let mut shapes = Shapes::default();
                while let Some(key) = map.next_key::<Key>()? {
                    match key {
                        Key::Model => once(&mut shapes.model, map.next_value()?, "model")?,
                        Key::Stream => once(&mut shapes.stream, map.next_value()?, "stream")?,
                        Key::Messages => once(&mut shapes.messages, map.next_value()?, "messages")?,
                        Key::Prompt => once(&mut shapes.prompt, map.next_value()?, "prompt")?,
                        Key::MaxCompletionTokens => once(
                            &mut shapes.max_completion_tokens,
                            map.next_value()?,
                            "max_completion_tokens",
                        )?,
                        Key::MaxTokens => {
                            once(&mut shapes.max_tokens, map.next_value()?, "max_tokens")?
                        }
                        Key::User => once(&mut shapes.user, map.next_value()?, "user")?,
                        Key::Other => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(shapes)
            }
        }

        deserializer.deserialize_map(ShapesVisitor)
    }
}

/// Parses an OpenAI request body for `endpoint`; `block_size` is the router's;
/// `tokenizer_of` gives a model's tokenizer, if it has one.
pub fn parse<'t>(
    endpoint: Endpoint,
    body: &[u8],
    block_size: u32,
    tokenizer_of: impl FnOnce(&str) -> Option<&'t ModelTokenizer>,
) -> Result<Prompt, InvalidRequest> {
    let fields = Shapes::read(body)?;
    let model = match fields.model {
        Some(Scalar::Str(model)) if !model.is_empty() => model.into_owned(),
        Some(_) => return Err(invalid("model", "`model` must be a non-empty string")),
        None => return Err(invalid("model", "`model` is required")),
    };
    let stream = match fields.stream {
        None | Some(Scalar::Null) => false,
        Some(Scalar::Bool(stream)) => stream,
        Some(_) => return Err(invalid("stream", "`stream` must be a boolean")),
    };
    let tokenizer = tokenizer_of(&model);
    let mut tokens = Vec::new();
    match endpoint {
        // The messages are checked (and pseudo-tokenized) from their borrowed shapes; a
        // tokenizer's template reads them as JSON values.
        Endpoint::ChatCompletions => match tokenizer {
            None => chat_tokens(fields.messages, &mut tokens)?,
            Some(tokenizer) => {
                chat_tokens(fields.messages, &mut Vec::new())?;
                // The template reads the messages as JSON values: the field's text again.
                let raw = Fields::read(body)?.messages;
                let messages: Value = value(raw, "messages")?.unwrap_or_default();
                tokens = tokenizer
                    .chat_tokens(&messages)
                    .map_err(|e| invalid("messages", format!("model `{model}`: {e}")))?;
            }
        },
        Endpoint::Completions => match (tokenizer, value(Given(fields.prompt), "prompt")?) {
            (Some(tokenizer), Some(Value::String(text))) => {
                tokens = tokenizer
                    .prompt_tokens(&text)
                    .map_err(|e| invalid("prompt", format!("model `{model}`: {e}")))?;
            }
            (_, prompt) => completion_tokens(prompt.as_ref(), &mut tokens)?,
        },
    }
    let max_tokens = fields.max_completion_tokens.or(fields.max_tokens);
    let expected_output_tokens = match max_tokens {
        None | Some(Scalar::Null) => None,
        Some(Scalar::Whole(tokens)) => Some(tokens),
        Some(_) => {
            return Err(invalid(
                "max_tokens",
                "`max_tokens` must be a whole number >= 0",
            ))
        }
    };
    let user = match fields.user {
        None | Some(Scalar::Null) => None,
        Some(Scalar::Str(user)) => Some(user.into_owned()),
        Some(_) => return Err(invalid("user", "`user` must be a string")),
    };
    let mut block_hashes = Vec::new();
    hash_tokens(&tokens, block_size, &mut block_hashes);
    Ok(Prompt {
        user,
        model,
        stream,
        request_blocks: (tokens.len() as u64).div_ceil(u64::from(block_size.max(1))),
        block_hashes: block_hashes.into(),
        tokens,
        expected_output_tokens,
    })
}

/// Appends the pseudo-tokens of `text`: little-endian groups of 4 bytes.
fn push_text(text: &str, tokens: &mut Vec<u32>) {
    for chunk in text.as_bytes().chunks(BYTES_PER_TOKEN) {
        let mut word = [0u8; 4];
        word[..chunk.len()].copy_from_slice(chunk);
        tokens.push(u32::from_le_bytes(word));
    }
}

/// Renders `messages` as `role\ncontent\n` per message (text parts of multi-part content
/// in order) into pseudo-tokens. Each message starts a new token, so a conversation that
/// grows by messages keeps the hashes of its earlier blocks.
fn chat_tokens(messages: Option<Messages>, tokens: &mut Vec<u32>) -> Result<(), InvalidRequest> {
    let messages = match messages {
        Some(Messages::List(messages)) if !messages.is_empty() => messages,
        Some(Messages::List(_)) => return Err(invalid("messages", "`messages` must not be empty")),
        Some(Messages::NotList) => {
            return Err(invalid("messages", "`messages` must be a list of messages"))
        }
        None => return Err(invalid("messages", "`messages` is required")),
    };
    // One buffer for every message's text: a message's tokens start at its own first byte.
    let mut text = String::with_capacity(64);
    for (i, message) in messages.iter().enumerate() {
        let (role, content) = match message {
            Message::Object {
                role: Some(Scalar::Str(role)),
                content,
            } => (role, content),
            _ => {
                return Err(invalid(
                    "messages",
                    format!("messages[{i}] needs a string `role`"),
                ))
            }
        };
        text.clear();
        text.push_str(role);
        text.push('\n');
        match content {
            Content::None => {}
            Content::Text(content) => text.push_str(content),
            Content::Parts(parts) => parts.iter().for_each(|part| text.push_str(part)),
            Content::Other => {
                return Err(invalid(
                    "messages",
                    format!("messages[{i}].content must be a string or a list of parts"),
                ))
            }
        }
        text.push('\n');
        push_text(&text, tokens);
    }
    Ok(())
}

/// A completion prompt: a string, a one-element list of strings, or token ids.
fn completion_tokens(prompt: Option<&Value>, tokens: &mut Vec<u32>) -> Result<(), InvalidRequest> {
    let several = || {
        invalid(
            "prompt",
            "switchyard routes one prompt per request; send batched prompts as separate requests",
        )
    };
    match prompt {
        Some(Value::String(text)) => push_text(text, tokens),
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(invalid("prompt", "`prompt` must not be empty"))
        }
        Some(Value::Array(items)) => match &items[0] {
            Value::String(text) if items.len() == 1 => push_text(text, tokens),
            Value::String(_) => return Err(several()),
            Value::Number(_) => {
                for item in items {
                    let id = item
                        .as_u64()
                        .and_then(|id| u32::try_from(id).ok())
                        .ok_or_else(|| {
                            invalid(
                                "prompt",
                                "token ids in `prompt` must be whole numbers < 2^32",
                            )
                        })?;
                    tokens.push(id);
                }
            }
            _ => return Err(several()),
        },
        Some(_) => {
            return Err(invalid(
                "prompt",
                "`prompt` must be a string, a list of one string, or a list of token ids",
            ))
        }
        None => return Err(invalid("prompt", "`prompt` is required")),
    }
    Ok(())
}

/// The fields of a request body that routing reads on every request, read as the shapes
/// routing needs and borrowed from the body: no map or list of the body is built (with
/// `serde_json::Value` each message became an ordered map of owned strings, which cost
/// more than the worker's selection). Nothing here judges a value; `prompt::parse` does,
/// naming the field. Everything read is nested within serde_json's recursion limit, as a
/// `Value` would be: a field routing reads refuses what a skipped field would skip.
mod shapes {
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

    /// A shape read from any JSON value by its visitor (declared here, a unit struct):
    /// every shape reads whatever the body holds and says what it found.
    macro_rules! read_by {
        ($shape:ty, $visitor:ident) => {
            impl<'de> Deserialize<'de> for $shape {
                fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                    deserializer.deserialize_any($visitor)
                }
            }

            struct $visitor;
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

    read_by!(Checked, CheckedVisitor);

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

    read_by!(Scalar<'de>, ScalarVisitor);

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

    read_by!(Messages<'de>, MessagesVisitor);

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

    read_by!(Message<'de>, MessageVisitor);

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

    read_by!(Content<'de>, ContentVisitor);

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

    read_by!(Part<'de>, PartVisitor);

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
}

#[cfg(test)]
mod tests;
