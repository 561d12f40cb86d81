//! A request's `token_ids`, read straight from the JSON text: a 512-token prompt is 512
//! numbers, and serde_json's element-by-element visit of them was a sixth of a
//! `/v1/select`'s CPU at 1,000 workers (docs/BENCHMARKS.md). serde_json still finds where
//! the array ends (and checks it is JSON); this reads the digits in one tight pass, in
//! time linear in the text, and says which element is wrong when one is.

use serde::{de::Error, Deserialize, Deserializer};
use serde_json::value::RawValue;

/// `token_ids` as `Option<Vec<u32>>` deserializes it: `null` or absent is none.
pub fn deserialize<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Vec<u32>>, D::Error> {
    let raw: Option<Box<RawValue>> = Option::deserialize(deserializer)?;
    raw.map(|raw| parse(raw.get()).map_err(D::Error::custom))
        .transpose()
}

/// A JSON array of whole numbers from 0 to `u32::MAX`.
pub fn parse(text: &str) -> Result<Vec<u32>, String> {
    let bytes = text.as_bytes();
    let mut at = skip_space(bytes, 0);
    if bytes.get(at) != Some(&b'[') {
        return Err(format!(
            "token_ids: expected an array of token ids, found `{}`",
            preview(&text[at..])
        ));
    }
    at = skip_space(bytes, at + 1);
    // At most one id per two bytes ("1,"): never reserve past what the text can hold.
    let mut ids = Vec::with_capacity(bytes.len() / 2);
    if bytes.get(at) == Some(&b']') {
        return Ok(ids);
    }
    loop {
        let start = at;
        let mut value: u64 = 0;
        while let Some(digit) = bytes
            .get(at)
            .and_then(|b| b.checked_sub(b'0'))
            .filter(|d| *d < 10)
        {
            value = value * 10 + u64::from(digit);
            if value > u64::from(u32::MAX) {
                return Err(element_error(ids.len(), &text[start..]));
            }
            at += 1;
        }
        // A number with a sign, fraction or exponent is no token id (serde's own `u32`
        // refuses them too); nor is a leading zero followed by more digits.
        let digits = at - start;
        let ends_number = !matches!(bytes.get(at), Some(b'.' | b'e' | b'E'));
        if digits == 0 || !ends_number || (digits > 1 && bytes[start] == b'0') {
            return Err(element_error(ids.len(), &text[start..]));
        }
        ids.push(value as u32);
        at = skip_space(bytes, at);
        match bytes.get(at) {
            Some(b',') => at = skip_space(bytes, at + 1),
            Some(b']') => return Ok(ids),
            _ => return Err(element_error(ids.len(), &text[at.min(text.len())..])),
        }
    }
}

fn skip_space(bytes: &[u8], mut at: usize) -> usize {
    while matches!(bytes.get(at), Some(b' ' | b'\n' | b'\r' | b'\t')) {
        at += 1;
    }
    at
}

fn element_error(index: usize, rest: &str) -> String {
    format!(
        "token_ids[{index}]: expected a token id (a whole number from 0 to {}), found `{}`",
        u32::MAX,
        preview(rest)
    )
}

/// The start of what was found, short enough for an error message.
fn preview(rest: &str) -> &str {
    let end = rest.char_indices().nth(24).map_or(rest.len(), |(i, _)| i);
    let end = rest[..end].find([',', ']']).unwrap_or(end);
    if end == 0 {
        &rest[..rest.len().min(1)]
    } else {
        &rest[..end]
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn reads_what_serde_reads_and_refuses_what_it_refuses() {
        let cases = [
            "[]",
            " [ ] ",
            "[0]",
            "[1,2,3]",
            "[ 1 ,\n 2\t, 3 ]",
            "[4294967295]",
            "[4294967296]",
            "[-1]",
            "[1.0]",
            "[1e3]",
            "[01]",
            "[1,]",
            "[,1]",
            "[1 2]",
            "[\"1\"]",
            "[null]",
            "{}",
            "7",
            "[1,2",
        ];
        for case in cases {
            let ours = parse(case);
            let serdes = serde_json::from_str::<Vec<u32>>(case);
            assert_eq!(
                ours.is_ok(),
                serdes.is_ok(),
                "{case}: {ours:?} / {serdes:?}"
            );
            if let (Ok(ours), Ok(serdes)) = (&ours, &serdes) {
                assert_eq!(ours, serdes, "{case}");
            }
        }
    }

    #[test]
    fn a_bad_element_is_named_by_its_index() {
        let error = parse("[1, 2, 3.5, 4]").unwrap_err();
        assert!(
            error.starts_with("token_ids[2]: expected a token id"),
            "{error}"
        );
        assert!(error.contains("found `3.5`"), "{error}");
        let error = parse("[1, 99999999999]").unwrap_err();
        assert!(error.starts_with("token_ids[1]"), "{error}");
    }
}
