//! A model's tokenizer and chat template, so the router hashes the very tokens the engine
//! will see: the model's GGUF file (the tokenizer llama.cpp reads from it,
//! `gguf_tokenizer.rs`), or Hugging Face's `tokenizer.json` (through the `tokenizers`
//! crate) and the chat template of the `tokenizer_config.json` beside it (through `minijinja`, configured as
//! `transformers` renders templates: trim_blocks, lstrip_blocks, Python string methods,
//! `raise_exception`).

use std::path::{Path, PathBuf};

use minijinja::{context, Environment, Error as TemplateError, ErrorKind};
use serde_json::Value;
use switchyard_plugin_host::file_gate::{self, FileKind};

/// Why a tokenizer could not be loaded: the file and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{}: {problem}", path.display())]
pub struct TokenizerError {
    pub path: PathBuf,
    pub problem: String,
}

struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

/// One model's tokenizer, with its chat template when its config has one.
pub struct ModelTokenizer {
    tokenizer: tokenizers::Tokenizer,
    chat: Option<ChatTemplate>,
}

/// A chat template's environment, configured as `transformers` renders templates.
fn template_env(source: String) -> Result<Environment<'static>, TemplateError> {
    let mut env = Environment::new();
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .expect("the default delimiters are valid"),
    );
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |message: String| -> Result<String, TemplateError> {
            Err(TemplateError::new(ErrorKind::InvalidOperation, message))
        },
    );
    env.add_template_owned("chat", source)?;
    Ok(env)
}

/// `bos_token` and friends are a string or an added-token object with `content`.
fn special_token(config: &Value, key: &str) -> String {
    match &config[key] {
        Value::String(token) => token.clone(),
        Value::Object(token) => token
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        _ => String::new(),
    }
}

impl ModelTokenizer {
    /// Loads the tokenizer at `path`: a GGUF model file (the tokenizer and chat template
    /// in its metadata, as llama.cpp serving that file reads them), or `tokenizer.json`
    /// with the chat template of the `tokenizer_config.json` in the same folder if there
    /// is one.
    pub fn load(path: &Path) -> Result<Self, TokenizerError> {
        let error = |path: &Path, problem: String| TokenizerError {
            path: path.to_owned(),
            problem,
        };
        if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
        {
            return Self::from_gguf(path).map_err(|problem| error(path, problem));
        }
        let bytes =
            file_gate::read(path, FileKind::Tokenizer).map_err(|e| error(path, e.to_string()))?;
        let tokenizer = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| {
            error(
                path,
                format!("not a loadable Hugging Face tokenizer.json ({e}); point `tokenizer:` at the model's tokenizer.json or its GGUF file"),
            )
        })?;
        drop(bytes);
        let config_path = path.with_file_name("tokenizer_config.json");
        let chat = match file_gate::read_text(&config_path, FileKind::TokenizerConfig) {
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(error(&config_path, e.to_string())),
            Ok(text) => {
                let config: Value = serde_json::from_str(&text)
                    .map_err(|e| error(&config_path, format!("is not valid JSON: {e}")))?;
                Self::chat_template(&config)
                    .map(|source| {
                        Ok(ChatTemplate {
                            env: template_env(source).map_err(|e| {
                                error(
                                    &config_path,
                                    format!("its chat_template does not parse: {e}"),
                                )
                            })?,
                            bos_token: special_token(&config, "bos_token"),
                            eos_token: special_token(&config, "eos_token"),
                        })
                    })
                    .transpose()?
            }
        };
        Ok(ModelTokenizer { tokenizer, chat })
    }

    /// The tokenizer and chat template of a GGUF model file.
    fn from_gguf(path: &Path) -> Result<Self, String> {
        let gguf = super::gguf::read(path).map_err(|e| e.to_string())?;
        let tokenizer = super::gguf_tokenizer::build(&gguf)?;
        let token = |id: Option<u32>| {
            id.and_then(|id| gguf.tokens.get(id as usize))
                .cloned()
                .unwrap_or_default()
        };
        let chat = gguf
            .chat_template
            .clone()
            .map(|source| {
                Ok::<_, String>(ChatTemplate {
                    env: template_env(source)
                        .map_err(|e| format!("its tokenizer.chat_template does not parse: {e}"))?,
                    bos_token: token(gguf.bos),
                    eos_token: token(gguf.eos),
                })
            })
            .transpose()?;
        Ok(ModelTokenizer { tokenizer, chat })
    }

    /// The `chat_template` of a tokenizer config: a string, or the `default` of a list of
    /// named templates.
    fn chat_template(config: &Value) -> Option<String> {
        match &config["chat_template"] {
            Value::String(template) => Some(template.clone()),
            Value::Array(named) => named
                .iter()
                .find(|t| t["name"] == "default")
                .and_then(|t| t["template"].as_str())
                .map(str::to_owned),
            _ => None,
        }
    }

    pub fn has_chat_template(&self) -> bool {
        self.chat.is_some()
    }

    /// The token ids of a chat request's prompt: the template rendered with the
    /// generation prompt, encoded without adding special tokens (the template has them).
    pub fn chat_tokens(&self, messages: &Value) -> Result<Vec<u32>, TokenizeError> {
        let chat = self.chat.as_ref().ok_or(TokenizeError::NoChatTemplate)?;
        let template = chat
            .env
            .get_template("chat")
            .map_err(TokenizeError::Template)?;
        let text = template
            .render(context! {
                messages => minijinja::Value::from(minijinja::value::Serde(messages)),
                add_generation_prompt => true,
                bos_token => chat.bos_token.as_str(),
                eos_token => chat.eos_token.as_str(),
            })
            .map_err(TokenizeError::Render)?;
        self.encode(&text, false)
    }

    /// The token ids of a completion prompt, with the tokenizer's special tokens.
    pub fn prompt_tokens(&self, text: &str) -> Result<Vec<u32>, TokenizeError> {
        self.encode(text, true)
    }

    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizeError> {
        self.tokenizer
            .encode_fast(text, add_special_tokens)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(TokenizeError::Encode)
    }
}

/// Why a prompt could not be tokenized as the engine would.
#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    #[error("the model's tokenizer_config.json has no chat_template; send completions, or add the template")]
    NoChatTemplate,
    #[error("{0}")]
    Template(minijinja::Error),
    #[error("the chat template failed: {0}")]
    Render(minijinja::Error),
    #[error("tokenizing the prompt failed: {0}")]
    Encode(tokenizers::Error),
}
