//! Limits on the config text, checked in one linear pass before the YAML parser runs.

/// The largest config text parsed (real configs are a few KB).
pub const MAX_CONFIG_BYTES: usize = 4 << 20;
/// The deepest nesting of flow collections (`[` and `{`) parsed: the YAML parser's time
/// grows with the square of it (a 100k-deep sequence took 36 s), and no config of this
/// schema nests deeper than a handful.
pub const MAX_FLOW_DEPTH: usize = 64;

/// Refuses, in one linear pass before the YAML parser sees it, a text too large, nested
/// too deep, or holding no document at all: an empty file is a mistake (a truncated
/// write, the wrong path), not a config that removes every plugin and worker.
pub(crate) fn check_shape(text: &str) -> Result<(), (Option<usize>, String)> {
    if text.len() > MAX_CONFIG_BYTES {
        return Err((
            None,
            format!(
                "the config has {} bytes, more than the {MAX_CONFIG_BYTES} a config may have",
                text.len()
            ),
        ));
    }
    let (mut depth, mut line, mut quote, mut comment) = (0usize, 1usize, None, false);
    let mut previous = '\n';
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quote) {
            ('\n', _) => {
                line += 1;
                comment = false;
            }
            _ if comment => {}
            ('\\', Some('"')) => {
                chars.next(); // an escaped character, `\"` included
            }
            (q, Some(open)) if q == open => quote = None,
            (_, Some(_)) => {}
            ('#', None) if previous.is_whitespace() => comment = true,
            ('"' | '\'', None) if !previous.is_alphanumeric() => quote = Some(c),
            ('[' | '{', None) => {
                depth += 1;
                if depth > MAX_FLOW_DEPTH {
                    return Err((
                        Some(line),
                        format!("collections nested more than {MAX_FLOW_DEPTH} deep; no setting of the config nests like this: check the file"),
                    ));
                }
            }
            (']' | '}', None) => depth = depth.saturating_sub(1),
            _ => {}
        }
        previous = c;
    }
    let has_content = text.lines().any(|l| {
        let l = l.trim();
        !l.is_empty() && !l.starts_with('#') && l != "---" && l != "..."
    });
    if !has_content {
        return Err((
            None,
            "the config is empty (no settings at all); write `{}` for a config of defaults only"
                .into(),
        ));
    }
    Ok(())
}
