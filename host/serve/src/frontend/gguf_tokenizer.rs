//! A GGUF file's tokenizer rebuilt as llama.cpp applies it (`src/llama-vocab.cpp`): for
//! `tokenizer.ggml.model: gpt2`, byte-level BPE over the file's tokens and merges, split
//! first by the pre-tokenizer `tokenizer.ggml.pre` names, with its control and
//! user-defined tokens matched whole in the text. Only the pre-tokenizers whose rules are
//! written here are accepted; any other is refused with what to do, rather than
//! tokenized almost like the engine (which would silently hash other blocks).

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, PreTokenizerWrapper, Tokenizer};

use super::gguf::GgufTokenizer;

/// llama.cpp's token types that are matched whole in text, never split by BPE.
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;

/// The split rules of a llama.cpp pre-tokenizer type, as `tokenizers` pre-tokenizers.
/// `gpt2`'s regex is byte-level BPE's own; `smollm` splits every digit off first
/// (llama.cpp's `\p{N}` rule before the same regex).
fn pre_tokenizer(pre: &str) -> Option<Vec<PreTokenizerWrapper>> {
    let byte_level = ByteLevel::new(false, true, true).into();
    match pre {
        "gpt2" | "default" => Some(vec![byte_level]),
        "smollm" => Some(vec![Digits::new(true).into(), byte_level]),
        _ => None,
    }
}

/// The tokenizer llama.cpp builds from `gguf`.
pub fn build(gguf: &GgufTokenizer) -> Result<Tokenizer, String> {
    if gguf.model != "gpt2" {
        return Err(format!(
            "its tokenizer is `{}` (tokenizer.ggml.model); the router reads byte-level BPE (`gpt2`) from GGUF files: point `tokenizer:` at the model's tokenizer.json instead",
            gguf.model
        ));
    }
    let Some(split) = pre_tokenizer(&gguf.pre) else {
        return Err(format!(
            "its pre-tokenizer is `{}` (tokenizer.ggml.pre), whose rules the router does not have (it has gpt2, smollm): point `tokenizer:` at the model's tokenizer.json instead",
            gguf.pre
        ));
    };
    if gguf.tokens.is_empty() || u32::try_from(gguf.tokens.len()).is_err() {
        return Err(format!("it holds {} tokens", gguf.tokens.len()));
    }
    let vocab: Vocab = gguf
        .tokens
        .iter()
        .enumerate()
        .map(|(id, token)| (token.clone(), id as u32))
        .collect();
    let merges = gguf
        .merges
        .iter()
        .map(|merge| {
            merge
                .split_once(' ')
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .ok_or_else(|| format!("its merge `{merge}` is not two tokens"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| format!("its vocabulary does not make a BPE model: {e}"))?;
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(Sequence::new(split)));
    tokenizer.with_decoder(Some(ByteLevel::default()));
    let whole: Vec<AddedToken> = gguf
        .tokens
        .iter()
        .zip(&gguf.token_types)
        .filter(|(_, &kind)| kind == CONTROL || kind == USER_DEFINED)
        .map(|(token, &kind)| AddedToken::from(token.clone(), kind == CONTROL))
        .collect();
    tokenizer.add_special_tokens(&whole);
    if let (true, Some(bos)) = (gguf.add_bos, gguf.bos) {
        let name = gguf.tokens.get(bos as usize).cloned().unwrap_or_default();
        let template = TemplateProcessing::builder()
            .try_single(format!("{name} $A"))
            .and_then(|b| b.try_pair(format!("{name} $A $B")))
            .map_err(|e| format!("its BOS token `{name}`: {e}"))?
            .special_tokens(vec![(name.clone(), bos)])
            .build()
            .map_err(|e| format!("its BOS token `{name}`: {e}"))?;
        tokenizer.with_post_processor(Some(template));
    }
    Ok(tokenizer)
}
